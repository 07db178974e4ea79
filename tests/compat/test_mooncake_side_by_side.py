"""The same Mooncake Store API calls, answered by the real Mooncake Store and by kvstore's
compatibility layer: every answer must match, except the differences the compatibility table
(docs/compat-mooncake.md) lists, each pinned here on both sides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import needs_mooncake, python_env

REPO = Path(__file__).resolve().parents[2]

# label -> (Mooncake's answer, kvstore's answer), in the scenario's JSON form
DIFFERENCES = {
    # Mooncake answers a one-element list for an empty batch; kvstore an empty one.
    "get_batch empty": ([{"bytes": ""}], []),
    # A finished read holds Mooncake's object lease (10 s) and blocks removal; kvstore's client
    # hands its read lease back, so the key can go at once.
    "remove a key just read": (-706, 0),
    # Mooncake fails multi-buffer reads whose buffers are larger than the value; kvstore fills them.
    "batch_get_into_multi_buffers larger than the value": ([-800], [16]),
    # remove_all removes every key on both sides: 24 in Mooncake, 23 here, where "b2" went already
    # (the "remove a key just read" difference above).
    "remove_all": ([24, [0, 0, 0]], [23, [0, 0, 0]]),
}


def _run(which: str, master: str, out: Path) -> list[Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.compat.mooncake_scenario", which, master, str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
        env=python_env(),
    )
    assert proc.returncode == 0, f"{which} scenario failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@needs_mooncake
@pytest.mark.timeout(600)
def test_kvstore_answers_as_mooncake_does(mooncake_master, kvstore_meta, tmp_path):
    real = _run("real", mooncake_master, tmp_path / "real.json")
    ours = _run("kvstore", kvstore_meta, tmp_path / "kvstore.json")
    assert [label for label, _ in real] == [label for label, _ in ours]
    mismatched = {}
    for (label, theirs), (_, mine) in zip(real, ours):
        expected = DIFFERENCES.get(label, (theirs, theirs))
        if (theirs, mine) != expected:
            mismatched[label] = {"mooncake": theirs, "kvstore": mine, "expected": expected}
    assert not mismatched, json.dumps(mismatched, indent=1)
    assert set(DIFFERENCES) <= {label for label, _ in real}
