"""The wheel, as a user gets it: `python -m build`, `pip install` into a clean venv (no extras),
then that venv's `kvstore serve`, `put` and `get` work, and each optional face that needs an extra
says which, in one line. With the `all` extra the faces' dependencies are there.

Installs use constraints/ci.txt, as CI's own install does (scripts/setup.sh)."""

import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.cluster import READY

REPO = Path(__file__).resolve().parents[2]
CONSTRAINTS = REPO / "constraints" / "ci.txt"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
_LEAVE_OUT = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
# What the optional faces import; the plain install has none of them.
_EXTRAS_MODULES = ("redis", "zmq", "msgpack", "rich")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=_LEAVE_OUT)  # builds never touch the checkout
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist")],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = (tmp / "dist").glob("kvcachestore-*.whl")
    return built


def _venv(tmp_path, requirement):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-c",
            str(CONSTRAINTS),
            requirement,
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert install.returncode == 0, install.stderr
    return venv


def _has(venv, module):
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([venv / "bin" / "python", "-c", probe], timeout=60).returncode == 0


def _fails_naming(kv, args, env, extra):
    """`kvstore ARGS` exits non-zero with one line on stderr naming the extra."""
    out = subprocess.run([kv, *args], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode != 0, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("error: Unavailable: ") and f"pip install 'kvcachestore[{extra}]'" in lines[0], lines
    return lines[0]


def test_the_wheel_installs_alone_and_serves(wheel, tmp_path):
    venv = _venv(tmp_path, str(wheel))
    assert not [m for m in _EXTRAS_MODULES if _has(venv, m)]  # no extras: the plain install
    kv = str(venv / "bin" / "kvstore")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KVSTORE_SECRET": "the wheel test secret"}
    version = subprocess.run([kv, "--version"], capture_output=True, text=True, env=env, timeout=60)
    assert version.stdout.startswith("kvstore ")
    serve = subprocess.Popen(
        [kv, "serve", "--port", "0", "--dram", "16MiB", "--admin-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert serve.stdout is not None
    try:
        for line in serve.stdout:
            if m := READY.search(line):
                faces = dict(word.split("=") for word in m.group(1).split() if "=" in word)
                meta = faces["meta"]
                break
        else:
            pytest.fail(f"kvstore serve from the wheel exited ({serve.wait()})")
        put = subprocess.run(
            [kv, "put", "--meta", meta, "k", "from the wheel"], env=env, capture_output=True, timeout=60
        )
        assert put.returncode == 0, put.stderr
        got = subprocess.run([kv, "get", "--meta", meta, "k"], env=env, capture_output=True, timeout=60)
        assert got.stdout == b"from the wheel"
        # the admin face (metrics are on by default; the indexer imports without the events extra)
        with urllib.request.urlopen(f"http://{faces['admin']}/metrics", timeout=30) as resp:
            assert b"kvstore_" in resp.read()
    finally:
        serve.terminate()
        assert serve.wait(timeout=30) == 0
    assert not list(tmp_path.glob("**/ssd-*.data"))  # no surprise disk use

    # The optional faces, each naming its extra.
    _fails_naming(kv, ["meta", "--port", "0", "--redis", "redis://127.0.0.1:1"], env, "ha")
    _fails_naming(kv, ["meta", "--port", "0", "--events-port", "0"], env, "events")
    _fails_naming(kv, ["top", "--once", "--meta", meta], env, "top")


def test_the_all_extra_brings_every_face(wheel, tmp_path):
    venv = _venv(tmp_path, f"{wheel}[all]")
    assert [m for m in _EXTRAS_MODULES if not _has(venv, m)] == []
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KVSTORE_SECRET": "the wheel test secret"}
    meta = subprocess.run(
        [str(venv / "bin" / "kvstore"), "meta", "--port", "0", "--redis", "redis://127.0.0.1:1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert meta.returncode != 0
    assert "Redis at redis://127.0.0.1:1 does not answer" in meta.stderr and "kvcachestore[" not in meta.stderr
