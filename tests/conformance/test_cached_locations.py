"""Reads from cached locations (kvstore/client/locations.py), over every transport: a key read
before is read again without a metadata call, and a cached location whose block was since
evicted, moved, removed or rewritten never hands out another key's bytes: the read returns the
key's own bytes or misses (KeyNotFound), as a read through the service would.

Each test runs a store of one 4 MiB segment and 1 MiB blocks, so what a test writes decides
where the next block lands. Watermarks are off (evictions happen only when a put needs room).
"""

import contextlib

import numpy as np
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KeyNotFound
from tests.cluster import wait_until
from tests.conformance.conftest import ONE_SIDED, SERVE_ALL, _tls
from tests.inprocess import InProcessStore

MIB = 1 << 20
NO_WATERMARKS = {"KVSTORE_META_HIGH_WATERMARK": "1.0", "KVSTORE_META_LOW_WATERMARK": "0.99"}
DEMOTE_ALL = {
    "KVSTORE_META_HIGH_WATERMARK": "1e-12",
    "KVSTORE_META_LOW_WATERMARK": "1e-13",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000000",
    "KVSTORE_META_TICK_INTERVAL_S": "0.05",
}


def block(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, MIB, dtype=np.uint8).tobytes()


REFILL_AT_ONCE = pytest.mark.usefixtures("refill_at_once")


@pytest.fixture
def refill_at_once(transport):
    if transport in ONE_SIDED:
        pytest.skip(
            f"{transport} writes are one-sided (no daemon receipt), so freed space waits out their write "
            "grants: a full 4 MiB store cannot be refilled at once. Its reads' grants hold space the same "
            "way, so a cached location cannot meet rewritten space before it expires"
        )


@pytest.fixture
def store(cluster, transport, pki):
    if transport == "inproc":  # the same store in this process (plain gRPC)
        with InProcessStore(NO_WATERMARKS, dram_size=4 * MIB, segment_size=4 * MIB) as local:
            yield local.address
        return
    meta_tls, daemon_tls = _tls(pki)
    _, address = cluster.meta(NO_WATERMARKS, *meta_tls)
    cluster.daemon(address, "4MiB", None, "--segment-size", "4MiB", *SERVE_ALL, *daemon_tls)
    yield address


@pytest.fixture
def clients(pki):
    def make(address: str, transport: str) -> tuple[KVClient, KVClient]:
        tls_ca = "" if transport == "inproc" else pki.ca
        config = ClientConfig(transports=(transport,), timeout_s=20, tls_ca=tls_ca)
        return KVClient(address, config), KVClient(address, config)

    return make


def hits(client: KVClient) -> int:
    """Lookups the service answered (a read from a cached location makes none)."""
    return sum(t.hits for t in client.stats().tiers)


def own_bytes_or_miss(client: KVClient, key: str, expected: bytes) -> bool:
    """Read `key`: True for its own bytes, False for a miss; anything else fails the test."""
    buf = bytearray(MIB)
    got = client.get_many_into([key], [buf], strict=False)[0]
    if isinstance(got, KeyNotFound):
        assert not any(buf), f"a miss of {key!r} left bytes in the buffer"
        return False
    assert got == MIB and bytes(buf) == expected, f"{key!r} read back bytes that are not its own"
    return True


def test_a_key_read_before_is_read_again_without_a_metadata_call(store, transport, clients):
    writer, reader = clients(store, transport)
    with writer, reader:
        writer.put("a", block(1))
        assert reader.get("a") == block(1)
        before = hits(reader)
        for _ in range(3):
            assert reader.get("a") == block(1)
            out = np.zeros(MIB, dtype=np.uint8)
            assert reader.get_into("a", out) == MIB and out.tobytes() == block(1)
        assert hits(reader) == before


def test_cached_location_of_a_removed_key(store, transport, clients):
    writer, reader = clients(store, transport)
    with writer, reader:
        writer.put("a", block(1))
        assert reader.get("a") == block(1)
        writer.remove("a", force=True)
        assert own_bytes_or_miss(reader, "a", block(1)) in (True, False)  # its own bytes, or a miss
        reader.put("b", block(2))
        assert reader.get("b") == block(2)
        reader.remove("b")  # the reader's own remove drops its cached location
        with pytest.raises(KeyNotFound):
            reader.get("b")


@REFILL_AT_ONCE
def test_cached_location_whose_space_was_rewritten_misses(store, transport, clients):
    """The block goes and its space is given to another key: the stale read must not return it."""
    writer, reader = clients(store, transport)
    with writer, reader:
        writer.put_many(["a", "x1", "x2", "x3"], [block(1), block(11), block(12), block(13)])  # full
        assert reader.get("a") == block(1)
        reader.get_many([])  # its read lease goes back
        writer.remove("a", force=True)
        writer.put("b", block(2))  # a's space, once no grant reaches it, else x1's
        assert writer.get("b") == block(2)
        own = own_bytes_or_miss(reader, "a", block(1))
        if transport == "shm":  # no daemon grant holds a's space: b got it
            assert own is False
        assert reader.get("b") == block(2)


@REFILL_AT_ONCE
def test_cached_location_of_an_evicted_block(store, transport, clients):
    writer, reader = clients(store, transport)
    with writer, reader:
        writer.put("a", block(1))
        assert reader.get("a") == block(1)
        reader.get_many([])
        writer.put_many(["x1", "x2", "x3"], [block(11), block(12), block(13)])  # full; a is the oldest
        writer.put_many(["y1", "y2"], [block(21), block(22)])  # evicts the least recently used
        assert not writer.exists("a")
        own_bytes_or_miss(reader, "a", block(1))
        for key, seed in (("y1", 21), ("y2", 22)):
            assert reader.get(key) == block(seed)


@REFILL_AT_ONCE
def test_reads_from_cached_locations_still_count_for_eviction(store, transport, clients):
    writer, reader = clients(store, transport)
    with writer, reader:
        writer.put("k1", block(1))
        assert reader.get("k1") == block(1)
        reader.get_many([])
        writer.put_many(["k2", "k3", "k4"], [block(2), block(3), block(4)])  # full; k1 the oldest ...
        assert reader.get("k1") == block(1)  # ... until this read, from the cached location,
        reader.get_many([])  # reaches the service with the reader's next call
        writer.put("k5", block(5))  # room for one: the least recently used goes
        assert writer.exists_many(["k1", "k2", "k3", "k4", "k5"]) == [True, False, True, True, True]


def test_cached_location_of_a_block_moved_to_ssd(cluster, transport, tmp_path, clients, pki):
    if transport in ONE_SIDED:
        pytest.skip(f"SSD segments are not offered over {transport}")
    if transport == "inproc":
        local = InProcessStore(
            DEMOTE_ALL, dram_size=4 * MIB, segment_size=4 * MIB, ssd_dir=str(tmp_path), ssd_size=64 * MIB
        )
        address = local.address
    else:
        meta_tls, daemon_tls = _tls(pki)
        _, address = cluster.meta(DEMOTE_ALL, *meta_tls)
        cluster.daemon(
            address,
            "4MiB",
            None,
            "--segment-size",
            "4MiB",
            *SERVE_ALL,
            *daemon_tls,
            "--ssd-dir",
            str(tmp_path),
            "--ssd",
            "64MiB",
        )
    writer, reader = clients(address, transport)
    with writer, reader, local if transport == "inproc" else contextlib.nullcontext():
        writer.put("a", block(1))
        assert reader.get("a") == block(1)  # cached while (perhaps) still in DRAM
        reader.get_many([])
        wait_until(  # blocks, not bytes: a shm writer's region keeps its DRAM reserved until it lapses
            lambda: next(t.blocks for t in writer.stats().tiers if t.tier.value == "dram") == 0,
            what="the block to be demoted to SSD",
        )
        writer.put("b", block(2))  # may land where a was in DRAM
        assert reader.get("a") == block(1)  # the old place or the new: its own bytes
        assert reader.get("b") == block(2)
