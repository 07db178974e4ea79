"""kvstore as LMCache's remote storage, loaded by LMCache's own plug-in mechanism
(remote_storage_plugins, no patching), with LMCache's real engine: one process stores a prompt's
KV chunks, another retrieves them byte-identical. See tests/compat/lmcache_engine.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore.client import KVClient
from kvstore.compat.lmcache import settings
from kvstore.errors import InvalidArgument
from tests.compat.conftest import python_env

REPO = Path(__file__).resolve().parents[2]
needs_lmcache = pytest.mark.skipif(
    importlib.util.find_spec("lmcache") is None, reason="LMCache is not installed: run scripts/install_lmcache.sh"
)


def _engine(role: str, meta: str, *flags: str, alias: bool = False, **env: str) -> dict[str, Any]:
    run = ["-m", "kvstore.compat.mooncake.run"] if alias else []
    proc = subprocess.run(
        [sys.executable, *run, "-m", "tests.compat.lmcache_engine", role, meta, *flags],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=python_env(PYTHONHASHSEED="0", **env),  # equal hashes even without vLLM
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")))


@needs_lmcache
@pytest.mark.parametrize("flags", [(), ("--no-chunk-meta",)], ids=["chunk-metadata", "bytes-only"])
def test_lmcache_stores_chunks_in_kvstore_and_another_process_retrieves_them(cluster, flags):
    _, meta = cluster.serve("64MiB")
    stored = _engine("store", meta, *flags)
    assert stored["remote_backend"] == "RemoteBackend" and stored["connector"] == "KVStoreConnector"
    assert stored["put_failed"] == 0
    assert stored["lookup"] == 300
    with KVClient(meta) as client:
        assert client.stats().keys == 5  # 4 full chunks of 64 tokens and one of 44
    got = _engine("retrieve", meta, *flags)
    assert got["lookup"] == 300 and got["retrieved_tokens"] == 300
    assert got["identical"] and got["rest_untouched"]
    assert got["missing_lookup"] == 0


@needs_lmcache
def test_chunks_lmcaches_own_mooncake_connector_wrote_read_back_by_the_kvstore_plug_in(cluster):
    """LMCache's MooncakestoreConnector, unchanged, over kvstore through the mooncake.store alias;
    its chunks (header + bytes, put with put_parts) are the layout kvstore's plug-in reads."""
    _, meta = cluster.serve("64MiB")
    stored = _engine("store", meta, "--via-mooncake", alias=True, KVSTORE_MOONCAKE_META=meta)
    assert stored["connector"] == "MooncakestoreConnector" and stored["lookup"] == 300
    got = _engine("retrieve", meta, "--via-mooncake")
    assert got["connector"] == "KVStoreConnector"
    assert got["retrieved_tokens"] == 300 and got["identical"] and got["rest_untouched"]


@needs_lmcache
def test_a_store_that_is_down_is_a_miss_for_lmcache(cluster):
    proc, meta = cluster.serve("32MiB")
    proc.kill()
    got = _engine("retrieve", meta, KVSTORE_CLIENT_TIMEOUT_S="1")
    assert got["lookup"] == 0 and got["retrieved_tokens"] == 0 and got["rest_untouched"]


def test_where_the_plug_in_connects(monkeypatch):
    monkeypatch.delenv("KVSTORE_LMCACHE_META", raising=False)
    assert settings.meta_address({"kvstore.meta": "h:1"}, "kvstore://h:2") == "h:1"
    assert settings.meta_address({}, "kvstore://h:2/") == "h:2"
    with pytest.raises(InvalidArgument, match=r"kvstore\.meta"):
        settings.meta_address(None, "plugin://kvstore")
    monkeypatch.setenv("KVSTORE_LMCACHE_META", "h:3")
    assert settings.meta_address(None, None) == "h:3"
    assert settings.key_prefix(None) == "lmcache/" and settings.key_prefix({"kvstore.key_prefix": "x/"}) == "x/"
    assert settings.key_prefix({"kvstore.key_prefix": ""}) == ""
