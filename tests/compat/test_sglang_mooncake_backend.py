"""SGLang's own `mooncake` HiCache storage backend, unchanged, over kvstore through the
mooncake.store alias: one process backs host KV pages up, another prefetches them byte for byte.
See tests/compat/sglang_mooncake_driver.py for what runs and what is stood in on this CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import python_env
from tests.compat.sglang_mooncake_driver import SGLANG_DIR

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not (SGLANG_DIR / "sglang").is_dir(),
    reason=f"SGLang's wheel is not unpacked at {SGLANG_DIR} (scripts/install_vllm.sh)",
)


def _driver(role: str, meta: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore.compat.mooncake.run", "tests/compat/sglang_mooncake_driver.py", role, meta],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=python_env(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")))


def test_sglang_mooncake_backend_runs_unchanged_on_kvstore(kvstore_meta):
    wrote = _driver("write", kvstore_meta)
    assert wrote["mooncake_store_module"] == "kvstore.compat.mooncake.store"  # the alias, not the wheel
    assert wrote["backend_class"] == "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store.MooncakeStore"
    assert set(wrote["stood_in"]) <= {
        "sglang.srt.mem_cache.pool_host",
        "sglang.srt.mem_cache.pool_host.mla",
        "sglang.srt.observability.metrics_collector",
    }
    for layout in ("mha", "mla"):  # batch_put_from, then the multi-buffer calls
        assert wrote[f"{layout}_set"] == [True] * 3 and wrote[f"{layout}_set_again"] == [True]
        assert wrote[f"{layout}_exists"] == 3
    read = _driver("read", kvstore_meta)
    for layout in ("mha", "mla"):
        assert read[f"{layout}_exists"] == 3
        assert read[f"{layout}_get"] == [True, True, True, False]
        assert read[f"{layout}_identical"] and read[f"{layout}_miss_untouched"]
        # SGLang's clear() is remove_all: as in Mooncake, every key of the store goes, the writer
        # process's pages included (docs/compat-mooncake.md, remove_all).
        assert read[f"{layout}_exists_after_clear"] == 0
