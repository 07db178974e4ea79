#!/usr/bin/env bash
# Issue 19's GPU checks in one call (docs/gpu.md): on the device machine, from the repository root,
#     bash scripts/device_check.sh            (after `bash scripts/device_wheels.sh` here, carry .whl)
# and here, without a GPU, the same script as a CPU dry run:
#     bash scripts/device_check.sh --cpu      (or plain: it falls back to the dry run without CUDA)
# Installs the carried wheels (.whl/) into a private directory, then runs scripts/device_check.py,
# which writes everything to $OUT/device_check.json (./device_check_out/ when OUT is unset).
# Each section reports its own failure and the next one still runs.
set -u
cd "$(dirname "$0")/.."
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python   # here; the device machine has no .venv
fi
export OUT=${OUT:-$PWD/device_check_out}
mkdir -p "$OUT"
# the TLS tests' certificates, made here by device_wheels.sh, for a machine without openssl (tests/pki.py)
[[ -d .whl/pki ]] && export KVSTORE_TEST_PKI=$PWD/.whl/pki
# the wheels are for the device machine's Python 3.12; a dry run uses what is installed here
if [[ " $* " != *" --cpu "* ]] && compgen -G ".whl/*.whl" >/dev/null; then
  site=${TMPDIR:-/tmp}/kvstore-device-site
  if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl; then
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "device_check: installing the carried wheels failed; going on with what is installed" >&2
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
exec "$PYTHON" -m scripts.device_check --out "$OUT" "$@"
