"""Each script in examples/ runs as a user would run it, and says what it should."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.conftest import needs_vllm, tiny_model  # noqa: F401 - the fixture, shared

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    # PYTHONPATH: this checkout's kvstore, whichever one the venv has installed.
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHON": sys.executable, **(env or {})}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_store_from_python():
    out = run(sys.executable, "examples/store_from_python.py")
    assert "b'some KV bytes'" in out and "reads back: True" in out and "[k/1, k/2, k/3]: 2" in out
    assert "miss: 'never-written' is not stored" in out and "2048 bytes in ['dram'], 1 replica(s)" in out


def test_sglang_hicache():
    out = run(sys.executable, "examples/sglang_hicache.py")
    assert "stored: [True, True]" in out and "leading pages stored: 2" in out and "same bytes: True" in out


@pytest.mark.slow
def test_pd_with_the_reference_engine():
    out = run(sys.executable, "examples/pd_reference.py")
    assert "route pd" in out and "gives the colocated tokens: True" in out


@pytest.mark.slow
@needs_vllm
@pytest.mark.timeout(900)
def test_vllm_1p1d(tiny_model):  # noqa: F811 - the fixture imported above
    out = run(
        "bash",
        "examples/vllm_1p1d.sh",
        timeout=840,
        env={
            "MODEL": tiny_model,
            "KV_CACHE_BYTES": str(64 << 20),
            "VLLM_ARGS": "--dtype float32 --block-size 32 --max-model-len 4096 --enforce-eager",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        },
    )
    assert "route: pd" in out and "text: '" in out
    loaded = [line for line in out.splitlines() if line.startswith("vllm:kvstore_load_blocks_total")]
    assert loaded and float(loaded[0].split()[-1]) > 0, out
