"""A wall clock that jumps, and a disk that fills."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from kvstore.client import KVClient
from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.cluster import wait_until
from tests.meta_helpers import SIGNER, commit, segment


def test_a_wall_clock_jump_drops_no_daemon_and_loses_no_key():
    clock = FakeClock()
    store = MetaStore(MetaConfig(heartbeat_ttl_s=10, lease_ttl_s=5), SIGNER, clock)
    store.mount_segment(segment("s1", "d1", Tier.DRAM, 1 << 20))
    keys = [f"k{i}" for i in range(10)]
    commit(store, keys, store.put_start(keys, [4096] * 10).results)
    for jump in (3600.0, -7200.0):  # forward an hour, then back two
        clock.jump(jump)
        store.tick()
        store.check_invariants()
        assert store.exists(keys) == [True] * 10
        assert len(store.stats().daemons) == 1
    clock.advance(11)  # real silence still counts: set aside...
    store.tick()
    assert store.exists(keys) == [True] * 10 and not store.stats().daemons
    clock.advance(store.config.silent_grace_s + 1)  # ...and dropped
    store.tick()
    assert store.exists(keys) == [False] * 10 and not store.stats().daemons


@pytest.fixture
def small_disk():
    """A 24 MiB filesystem of its own (tmpfs), or skip where mounting is not allowed."""
    mount = tempfile.mkdtemp(prefix="kvstore-disk-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", mount], capture_output=True)
    if done.returncode != 0:
        os.rmdir(mount)
        pytest.skip(f"cannot mount a small filesystem here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", mount], check=False)
    os.rmdir(mount)


def test_a_full_disk_keeps_every_block_readable_and_the_daemon_serving(faults, small_disk):
    _, meta = faults.meta()
    faults.daemon(meta, "8MiB", None, "--segment-size", "8MiB", "--ssd-dir", small_disk, "--ssd", "16MiB")
    filler = os.path.join(small_disk, "filler")
    with open(filler, "wb") as fh:  # the rest of the disk: the journal cannot grow
        try:
            while True:
                fh.write(b"\0" * (1 << 20))
                fh.flush()
        except OSError:
            pass
    values = {f"k{i}": bytes([i]) * (512 << 10) for i in range(40)}  # 20 MiB: most must go to SSD
    with KVClient(meta) as client:
        for key, value in values.items():
            wait_until(lambda k=key, v=value: _put(client, k, v), timeout=30, what=f"room for {key}")
        stored = [k for k in values if client.exists(k)]
        assert stored
        assert client.get_many(stored) == [values[k] for k in stored]  # byte-identical, wherever they are
        wait_until(lambda: _put(client, "after", b"a"), timeout=30, what="room once the read leases end")
        assert client.get("after") == b"a"


def _put(client: KVClient, key: str, value: bytes) -> bool:
    try:
        client.put(key, value)
        return True
    except Exception:  # noqa: BLE001 - NoSpace while demotion makes room
        return False
