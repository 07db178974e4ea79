#!/usr/bin/env bash
# What kvstore needs on a fresh Debian machine with Python 3.11, in a virtual environment in .venv.
#   bash scripts/setup.sh store   the store alone (kvstore serve, the CLI, the Python client): seconds
#   bash scripts/setup.sh         everything the tests use: the extras, the system libraries
#                                 Mooncake links against, vLLM's CPU build, SGLang's wheel, LMCache
# Safe to run again; fast when done.
set -euo pipefail
cd "$(dirname "$0")/.."

MODE=${1:-all}
[[ $MODE == store || $MODE == all ]] || { echo "usage: scripts/setup.sh [store|all]" >&2; exit 2; }
PY=${PYTHON:-python3}
STAMP=.venv/.kvstore-setup-$MODE
want="$(sha256sum pyproject.toml constraints/ci.txt scripts/setup.sh scripts/install_vllm.sh scripts/install_lmcache.sh \
  | sha256sum | cut -c1-16)"
if [[ -f $STAMP && $(cat $STAMP) == "$want" ]]; then
  exit 0
fi

pip_install() {   # quiet when it works; its whole log, and a failed setup, when it does not
  local log
  log=$(mktemp)
  if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" >&2
    rm -f "$log"
    echo "setup: pip install $* failed" >&2
    exit 1
  fi
  rm -f "$log"
}

[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
pip_install --upgrade pip
# The distribution was called `kvstore` before it took a free PyPI name: drop that editable
# install, or two distributions would claim the package.
if .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit('editable' not in (m.distribution('kvstore').read_text('direct_url.json') or ''))" 2>/dev/null; then
  .venv/bin/python -m pip uninstall -q -y kvstore 2>&1 | grep -v "^WARNING: Location" || true
fi

# pyproject.toml states ranges; constraints/ci.txt pins the versions the project is tested with.
if [[ $MODE == store ]]; then
  pip_install -c constraints/ci.txt -e .
  .venv/bin/python -c "import kvstore.client, kvstore.cli, grpc, numpy, xxhash" \
    || { echo "setup: kvstore does not import after install" >&2; exit 1; }
  echo "$want" > $STAMP
  echo "setup: done (.venv, the store only; \`make test\` installs the rest)"
  exit 0
fi

# System libraries that Mooncake's wheel links against (RDMA verbs, NUMA), from Debian; redis-server
# and redis-tools (redis-cli joins the tests' Redis Cluster), for metadata on Redis (kvstore meta
# --redis) and its tests; openssl, which makes the TLS tests' certificates; chromium for the dashboard's browser
# test (Playwright drives it: its own browser download cannot run here) and prometheus for promtool,
# which checks and evaluates docs/prometheus/alerts.yml in the tests.
missing=()
for pkg in libibverbs1 librdmacm1 ibverbs-providers libnuma1 redis-server redis-tools openssl chromium prometheus; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# Every extra; torch is pinned by the constraints: 2.13.0 is the CPU build, unpinned pulls a CUDA build.
pip_install -c constraints/ci.txt -e ".[dev,engines,mooncake,nixl,ucx,ha,events,top]"
# vLLM's CPU build for the vLLM connector's end-to-end tests (and SGLang's wheel, unpacked).
bash scripts/install_vllm.sh
bash scripts/install_lmcache.sh   # LMCache (--no-deps, pinned) for kvstore.compat.lmcache's tests
.venv/bin/python -c "import kvstore.client, grpc, numpy, xxhash, redis, zmq, msgpack, rich" \
  || { echo "setup: kvstore does not import after install" >&2; exit 1; }
echo "$want" > $STAMP
echo "setup: done (.venv)"
