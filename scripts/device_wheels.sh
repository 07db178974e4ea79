#!/usr/bin/env bash
# The wheels the device machine lacks (it has no network; docs/gpu.md), downloaded here into .whl/
# for its Python 3.12 on x86-64: the metadata service's gRPC health checking, and grpcio and
# protobuf at the versions kvstore's generated code was made with (the machine's own may be older),
# with grpcio's one requirement (typing-extensions ~= 4.12; the machine's is likely new enough).
# The device call then names .whl in `carry`; scripts/device_check.sh installs them. ~8 MB.
# Also the TLS tests' certificates (tests/pki.py, valid two days: run this again before a later
# device call), for a device machine without the openssl command.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  grpcio==1.85.3 grpcio-health-checking==1.85.1 protobuf==7.36.2 typing-extensions==4.16.0
ls -la .whl
PYTHON=python3
[[ -x .venv/bin/python ]] && PYTHON=.venv/bin/python
rm -rf .whl/pki && "$PYTHON" -c 'from pathlib import Path; from tests.pki import make_pki; make_pki(Path(".whl/pki"))'
