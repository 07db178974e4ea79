"""Resharding S -> 2S (`kvstore reshard`): every committed key reaches the store of the new shard
count with its bytes, spread over the new shards; a second run moves nothing; a key the target
holds with other bytes is replaced by the source's."""

from __future__ import annotations

import os
import subprocess
import sys

from kvstore.client import KVClient
from tests.cluster import Cluster


def test_resharding_2_to_4_moves_every_committed_key_and_is_repeatable():
    cluster = Cluster()
    try:
        _, old = cluster.serve("128MiB", "--shards", "2")
        _, new = cluster.serve("128MiB", "--shards", "4")
        keys = [f"rs/{i}" for i in range(400)]
        data = [k.encode() + os.urandom(2000) for k in keys]
        with KVClient(old) as client:
            client.put_many(keys, data)
        with KVClient(new) as client:
            client.put("rs/7", b"other bytes")  # the target has one key with other bytes
        first = _reshard(old, new)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "copied 400 keys" in first.stdout and "every key is in the new store" in first.stdout
        with KVClient(new) as client:
            assert client.get_many(keys) == data
            stats = client.stats()
            assert stats.shards == 4 and all(s.keys > 50 for s in stats.per_shard)  # spread over all four
        again = _reshard(old, new)
        assert again.returncode == 0 and "copied 0 keys" in again.stdout and "400 already there" in again.stdout
        with KVClient(old) as client:
            assert client.get_many(keys) == data  # the old store is left as it was
    finally:
        cluster.close()


def test_resharding_needs_a_source():
    done = subprocess.run(
        [sys.executable, "-m", "kvstore", "reshard", "--to", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "KVSTORE_META"},
    )
    assert done.returncode != 0 and "--from" in done.stderr and "Traceback" not in done.stderr


def _reshard(old: str, new: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvstore", "reshard", "--from", old, "--to", new],
        capture_output=True,
        text=True,
        timeout=300,
    )
