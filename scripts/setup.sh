#!/usr/bin/env bash
# Everything kvstore needs on a fresh Debian machine with Python 3.11: system libraries, a virtual
# environment in .venv, and the package with its extras. Safe to run again; fast when done.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
STAMP=.venv/.kvstore-setup
want="$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [[ -f $STAMP && $(cat $STAMP) == "$want" ]]; then
  exit 0
fi

# System libraries that Mooncake's wheel links against (RDMA verbs, NUMA), from Debian.
missing=()
for pkg in libibverbs1 librdmacm1 ibverbs-providers libnuma1; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  sudo=""; [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# torch is pinned: 2.13.0 is the CPU build this machine has locally; unpinned pulls a CUDA build.
.venv/bin/python -m pip install -q -e ".[dev,torch,engines,mooncake,ucx]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import kvstore.client, grpc, numpy, xxhash" \
  || { echo "setup: kvstore does not import after install" >&2; exit 1; }
echo "$want" > $STAMP
echo "setup: done (.venv)"
