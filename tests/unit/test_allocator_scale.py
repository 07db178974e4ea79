"""Restoring a segment's blocks after a takeover: the work is linear in the records (up to a
sort), and the ranges reserved are exactly those reserve() one by one would reserve.

Work is counted, never timed: the Python lines the metadata package runs during restore.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

import kvstore.meta
from kvstore.meta import recovery
from kvstore.meta.allocator import OffsetAllocator
from kvstore.meta.records import ObjectRecord, SegmentRecord
from kvstore.meta.segments import pack_location
from kvstore.meta.state import MetaState
from kvstore.types import Endpoint, SegmentInfo, Tier

BLOCK = 4096
NUMBER = 7


def segment_record(blocks: int) -> SegmentRecord:
    # Room for a gap after every block, as freed blocks leave them: the free list fragments.
    info = SegmentInfo("seg-restore", "d1", Tier.DRAM, 2 * blocks * BLOCK, (Endpoint("tcp", "127.0.0.1:1"),))
    return SegmentRecord(NUMBER, info)


def object_records(blocks: int, seed: int = 1) -> list[tuple[str, ObjectRecord]]:
    """One record per block, in a key order unrelated to the blocks' offsets (as a journal has)."""
    slots = list(range(blocks))
    random.Random(seed).shuffle(slots)
    return [
        (f"key-{i}", ObjectRecord(BLOCK, i, 1, (pack_location(NUMBER, 2 * slot * BLOCK),)))
        for i, slot in enumerate(slots)
    ]


def lines_run_restoring(blocks: int) -> int:
    package = kvstore.meta.__path__[0]
    lines = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if not frame.f_code.co_filename.startswith(package):
            return None
        if event == "line":
            lines += 1
        return trace

    st = MetaState()
    segments, objects = [segment_record(blocks)], object_records(blocks)
    previous = sys.gettrace()  # a coverage tracer, say: put back after
    sys.settrace(trace)
    try:
        report = recovery.restore(st, segments, objects, [], {}, 0.0, 0.0)
    finally:
        sys.settrace(previous)
    assert report.objects == blocks and report.replicas_dropped == 0
    st.segments.by_number(NUMBER).allocator.check_invariants()
    return lines


def test_restoring_a_segment_is_linear_in_its_blocks() -> None:
    small, large = lines_run_restoring(400), lines_run_restoring(1600)
    # 4x the blocks: 4x the work (the sorts run in C); reserving one at a time by scanning the
    # free list was 16x.
    assert large <= 4.5 * small, (small, large)


def test_a_range_two_records_claim_goes_to_the_first() -> None:
    st = MetaState()
    loc = pack_location(NUMBER, 0)
    objects = [
        ("a", ObjectRecord(BLOCK, 1, 1, (loc,))),
        ("b", ObjectRecord(2 * BLOCK, 2, 1, (pack_location(NUMBER, BLOCK),))),  # overlaps nothing of a
        ("c", ObjectRecord(BLOCK, 3, 2, (pack_location(NUMBER, 4 * BLOCK), loc))),  # loses loc to a
        ("d", ObjectRecord(BLOCK, 4, 1, (loc,))),  # loses its only replica
        ("e", ObjectRecord(BLOCK, 5, 1, (pack_location(NUMBER + 1, 0),))),  # a segment that is gone
    ]
    report = recovery.restore(st, [segment_record(16)], objects, [], {}, 0.0, 0.0)
    assert report == recovery.Restored(segments=1, objects=3, replicas_dropped=3, objects_dropped=2)
    assert st.index.is_complete("a") and st.index.is_complete("b") and st.index.is_complete("c")
    assert not st.index.is_complete("d") and not st.index.is_complete("e")
    assert st.under_replicated == {"c": 2}
    st.segments.by_number(NUMBER).allocator.check_invariants([(0, BLOCK), (BLOCK, 2 * BLOCK), (4 * BLOCK, BLOCK)])


def random_ranges(rng: random.Random, a: OffsetAllocator, count: int) -> Iterator[tuple[int, int]]:
    """Ranges of every kind reserve() meets: free, overlapping each other or allocated blocks,
    repeated, misaligned, outside the segment."""
    for _ in range(count):
        kind = rng.random()
        if kind < 0.05:
            yield rng.randrange(1, a.capacity), 64  # mostly misaligned
        elif kind < 0.1:
            yield a.capacity - 64 * rng.randrange(0, 3), 64 * rng.randrange(1, 5)  # at or past the end
        else:
            yield 64 * rng.randrange(0, a.capacity // 64), rng.choice([1, 64, 100, 640, 4096, 20_000])


@pytest.mark.parametrize("seed", range(12))
def test_reserve_all_answers_as_reserve_one_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    capacity = rng.choice([1 << 16, 1 << 18, (1 << 18) + 1000])
    one, bulk = OffsetAllocator(capacity), OffsetAllocator(capacity)
    live = []
    for _ in range(rng.randrange(0, 60)):  # some space allocated already, the free list fragmented
        size = rng.choice([64, 500, 4096])
        if (o := one.allocate(size)) is not None:
            assert bulk.allocate(size) == o
            live.append((o, size))
    for o, size in live[::3]:
        one.free(o, size)
        bulk.free(o, size)
    kept = [b for b in live if b not in live[::3]]
    ranges = list(random_ranges(rng, one, rng.choice([1, 2, 50, 400])))
    expected = [one.reserve(o, size) for o, size in ranges]
    assert bulk.reserve_all(ranges) == expected
    assert bulk.used == one.used
    assert sorted(bulk._free_at.items()) == sorted(one._free_at.items())  # the same free blocks
    reserved = [r for r, ok in zip(ranges, expected, strict=True) if ok]
    bulk.check_invariants(kept + reserved)


def test_reserve_all_settles_a_chain_of_overlaps_by_order() -> None:
    a = OffsetAllocator(1 << 20)
    # Each range overlaps its neighbours; listed so that the first-come rule, not position, decides.
    ranges = [(640, 128), (0, 128), (64, 128), (576, 128), (128, 128), (512, 128), (192, 384)]
    assert a.reserve_all(ranges) == [True, True, False, False, True, True, False]
    a.check_invariants([(640, 128), (0, 128), (128, 128), (512, 128)])
