"""The opt-in alias: unchanged code that does `from mooncake.store import ...` runs against
kvstore when (and only when) it is switched on, in the process and in those it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvstore.compat.mooncake import alias
from tests.compat.conftest import MOONCAKE_MISSING, needs_mooncake, python_env

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "tests/compat/mooncake_examples"


def _python(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
        env=env or python_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def _origins(out: str) -> dict[str, Any]:
    return json.loads(next(line for line in out.splitlines() if line.startswith("ORIGINS "))[8:])


def test_run_switches_the_alias_on_for_the_script_and_its_children():
    out = _origins(_python("-m", "kvstore.compat.mooncake.run", str(EXAMPLES / "which_store.py"), "a", "--b"))
    stand_in = alias.ALIAS_PATH
    assert out["main"]["class"] == out["spawned"]["class"] == "kvstore.compat.mooncake.store"
    assert out["main"]["store"].startswith(stand_in) and out["spawned"]["store"].startswith(stand_in)
    assert out["subprocess"].startswith(stand_in)
    assert out["argv"] == [str(EXAMPLES / "which_store.py"), "a", "--b"] and out["name"] == "__main__"
    if not MOONCAKE_MISSING:  # the rest of the real package is still the real one
        assert out["main"]["engine"].endswith(".so") and not out["main"]["engine"].startswith(stand_in)


def test_run_runs_modules_too():
    out = _origins(
        _python("-m", "kvstore.compat.mooncake.run", "-m", "tests.compat.mooncake_examples.which_store", "x")
    )
    assert out["main"]["class"] == "kvstore.compat.mooncake.store" and out["argv"][1:] == ["x"]


def test_the_env_switch_is_pythonpath():
    path = _python("-m", "kvstore.compat.mooncake.run", "--print-path").strip()
    assert path.split(":")[0] == alias.ALIAS_PATH
    out = _origins(_python(str(EXAMPLES / "which_store.py"), env=python_env(PYTHONPATH=path), cwd=EXAMPLES))
    assert out["main"]["class"] == out["spawned"]["class"] == "kvstore.compat.mooncake.store"


@needs_mooncake
def test_without_the_switch_mooncake_is_untouched():
    out = _origins(_python(str(EXAMPLES / "which_store.py"), cwd=EXAMPLES))
    assert out["main"]["class"] == out["spawned"]["class"] == "mooncake.store"
    assert out["main"]["store"].endswith(".so") and out["subprocess"].endswith(".so")


def test_mooncakes_own_examples_run_unchanged_against_kvstore(kvstore_meta):
    out = _python(
        "-m",
        "kvstore.compat.mooncake.run",
        str(EXAMPLES / "hello_world.py"),
        env=python_env(KVSTORE_MOONCAKE_META=kvstore_meta),
    )
    assert out.splitlines() == [
        "Hello, Mooncake Store!",
        "Successfully stored 4000000 bytes with zero-copy",
        "Successfully retrieved 4000000 bytes with zero-copy",
        "Data matches: True",
    ]


def test_usage():
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore.compat.mooncake.run"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and "usage" in proc.stderr
