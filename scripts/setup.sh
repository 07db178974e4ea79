#!/usr/bin/env bash
# Everything kvstore needs on a fresh Debian machine with Python 3.11: system libraries, a virtual
# environment in .venv, and the package with its extras. Safe to run again; fast when done.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
STAMP=.venv/.kvstore-setup
want="$(sha256sum pyproject.toml scripts/setup.sh scripts/install_vllm.sh | sha256sum | cut -c1-16)"
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
# torch is pinned: 2.13.0 is the CPU build this machine has locally; unpinned pulls a CUDA build.
pip_install -e ".[dev,torch,engines,mooncake,ucx]"
# vLLM's CPU build for the vLLM connector's end-to-end tests (and SGLang's wheel, unpacked).
bash scripts/install_vllm.sh
.venv/bin/python -c "import kvstore.client, grpc, numpy, xxhash" \
  || { echo "setup: kvstore does not import after install" >&2; exit 1; }
echo "$want" > $STAMP
echo "setup: done (.venv)"
