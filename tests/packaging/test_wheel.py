"""The wheel, as a user gets it: `python -m build`, `pip install` into a clean venv (no extras),
then that venv's `kvstore serve`, `put` and `get` work."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import READY

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
_LEAVE_OUT = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")


def test_the_wheel_installs_alone_and_serves(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_LEAVE_OUT)  # builds never touch the checkout
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist")],
                   cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("kvcachestore-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    str(wheel)], check=True, capture_output=True, timeout=400)
    kv = str(venv / "bin" / "kvstore")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    version = subprocess.run([kv, "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.stdout.startswith("kvstore ")
    serve = subprocess.Popen([kv, "serve", "--port", "0", "--dram", "16MiB"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        for line in serve.stdout:
            if m := READY.search(line):
                meta = m.group(1).split("=")[1].split()[0]
                break
        else:
            pytest.fail(f"kvstore serve from the wheel exited ({serve.wait()})")
        put = subprocess.run([kv, "put", "--meta", meta, "k", "from the wheel"], env=env, capture_output=True,
                             timeout=60)
        assert put.returncode == 0, put.stderr
        got = subprocess.run([kv, "get", "--meta", meta, "k"], env=env, capture_output=True, timeout=60)
        assert got.stdout == b"from the wheel"
    finally:
        serve.terminate()
        assert serve.wait(timeout=30) == 0
    assert not list(tmp_path.glob("**/ssd-*.data"))  # no surprise disk use
