"""The index keeps each COMPLETE object as one int (kvstore/meta/entry.py): every field comes back as
it went in, a field too wide is refused (not silently cut), and the garbage collector never walks
the index, so a full collection's pause does not grow with the blocks held. Counted, never timed."""

from __future__ import annotations

import gc
import random

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.meta import entry as packing
from kvstore.meta.index import Entry, ObjectIndex
from kvstore.meta.records import ObjectRecord, decode_object, encode_object
from kvstore.meta.segments import pack_location
from kvstore.meta.store import MetaStore
from kvstore.results import Block
from kvstore.types import Tier
from tests.meta_helpers import SIGNER, commit, segment

M64 = (1 << 64) - 1


def stored(index: ObjectIndex, key: str) -> Entry:
    entry = index.get(key)
    assert entry is not None, f"{key!r} is not COMPLETE"
    return entry


@pytest.mark.parametrize("seed", range(3))
def test_every_field_comes_back_as_it_went_in(seed):
    rng = random.Random(seed)
    for _ in range(2000):
        replicas = rng.choice([1, 1, 1, 2, 3, packing.MAX_REPLICAS])
        locations = [rng.choice([0, M64, rng.getrandbits(64)]) for _ in range(replicas)]
        loc = locations[0] if replicas == 1 else tuple(locations)
        size = rng.choice([1, (1 << 48) - 1, rng.randrange(1, 1 << 48)])
        checksum, stamp = rng.choice([0, M64, rng.getrandbits(64)]), rng.choice([0, M64, rng.getrandbits(64)])
        packed = packing.encode(loc, size, checksum, stamp)
        assert packing.decode(packed) == (loc, size, checksum, stamp)
        assert packing.stamp_of(packed) == stamp
        assert packing.single_location(packed) == (loc if replicas == 1 else None)
        new_stamp = rng.getrandbits(64)
        assert packing.decode(packing.restamped(packed, new_stamp)) == (loc, size, checksum, new_stamp)


@pytest.mark.parametrize(
    ("loc", "size", "checksum"),
    [
        (1, 4096, -1),
        (1, 4096, 1 << 64),
        (1, 0, 7),
        (1, 1 << 48, 7),
        (-1, 4096, 7),
        (1 << 64, 4096, 7),
        ((1, 1 << 64), 4096, 7),
        ((), 4096, 7),
        (tuple(range(packing.MAX_REPLICAS + 1)), 4096, 7),
    ],
)
def test_a_field_too_wide_is_refused_and_the_index_is_unchanged(loc, size, checksum):
    with pytest.raises(InvalidArgument):
        packing.encode(loc, size, checksum, 1)
    index = ObjectIndex()
    locations = loc if isinstance(loc, tuple) else (loc,)
    fits = 0 < len(locations) <= packing.MAX_REPLICAS and all(0 <= x <= M64 for x in locations) and 0 < size < 1 << 48
    if fits:  # only the checksum is off
        with pytest.raises(InvalidArgument):
            index.insert_complete("k", locations, size, checksum)
        assert index.get("k") is None and len(index) == 0
        index.insert_complete("k", locations, size, 7)  # the key is still free
        index.check_invariants()


def test_a_checksum_over_64_bits_from_a_writer_is_refused_and_nothing_is_lost():
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("dram", "d1", Tier.DRAM, 1 << 20))
    commit(store, ["kept"], store.put_start(["kept"], [4096]).results)
    results = store.put_start(["bad"], [4096]).results
    with pytest.raises(InvalidArgument):
        store.put_end(["bad"], [1 << 64], unchecked_ok=True)
    assert store.get(["kept"]).results[0].code is ErrorCode.OK
    store.check_invariants()
    commit(store, ["bad"], results)  # the put is still open: a good checksum ends it
    assert store.get(["bad"]).results[0].code is ErrorCode.OK


def test_the_collector_never_walks_the_index():
    index = ObjectIndex()
    gc.collect()
    tracked = len(gc.get_objects())
    for i in range(5000):
        index.insert_complete(f"k{i}", (pack_location(i % 4, i * 4096),), 4096, i)
    for i in range(0, 5000, 7):
        index.touch(f"k{i}")
    index.insert_complete("replicated", (pack_location(1, 1 << 30), pack_location(2, 1 << 30)), 4096, 1)
    index.set_replicas("k1", (pack_location(1, 1 << 31), pack_location(3, 1 << 31)))
    gc.collect()
    assert not gc.is_tracked(index._complete)  # a dict of str keys and int values
    # 5,000 objects held: a few containers more for the collector (orders' lists), not one per key.
    assert len(gc.get_objects()) - tracked < 100
    assert stored(index, "replicated").replicas() == (pack_location(1, 1 << 30), pack_location(2, 1 << 30))
    assert stored(index, "k1").replicas() == (pack_location(1, 1 << 31), pack_location(3, 1 << 31))
    index.check_invariants()


def test_an_entry_read_keeps_its_values_when_the_key_is_touched_or_moved():
    index = ObjectIndex()
    index.insert_complete("a", (pack_location(0, 0),), 4096, 11)
    index.insert_complete("b", (pack_location(0, 4096),), 4096, 12)
    before = stored(index, "a")
    index.touch("a")
    index.set_replicas("a", (pack_location(1, 0),))
    after = stored(index, "a")
    assert before.stamp < after.stamp and before.locations == pack_location(0, 0)
    assert after.locations == pack_location(1, 0) and after.checksum == 11 and after.size == 4096
    assert [k for k, _ in index.least_recent()] == ["b", "a"]
    index.check_invariants()


def test_what_no_entry_can_hold_is_refused_where_it_enters():
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("ssd", "d1", Tier.SSD, 1 << 20))
    store.mount_segment(segment("dram", "d1", Tier.DRAM, 1 << 20))
    # a block a daemon announces: refused before its range is taken, which stays free for the next
    bad, good = Block("a", 0, 4096, 1 << 64), Block("b", 0, 4096, 5)
    assert [r.code for r in store.announce("ssd", [bad, good])] == [ErrorCode.INVALID_ARGUMENT, ErrorCode.OK]
    with pytest.raises(InvalidArgument, match="replica_num"):
        store.put_start(["c"], [4096], replica_num=packing.MAX_REPLICAS + 1)
    store.check_invariants()
    # a journal record (Redis) no entry can hold loads as unreadable, to be skipped and counted
    for size, places in ((0, 1), (1 << 48, 1), (4096, packing.MAX_REPLICAS + 1)):
        data = encode_object(ObjectRecord(size, 7, 1, tuple(range(places))))
        with pytest.raises(InvalidArgument):
            decode_object(data)
    assert decode_object(encode_object(ObjectRecord(4096, 7, 1, (3,)))) == ObjectRecord(4096, 7, 1, (3,))
