"""Failover cost: how long a service taking over spends restoring one segment's blocks from the
journal's records (the allocator reserving every replica's range, the index taking every key).

`python -m benchmarks.takeover [BLOCKS ...]` prints min/median/max seconds of RUNS restores
per size (default 10^4, 10^5, 10^6 blocks). The blocks fill the segment in a key order unrelated
to their offsets, as a journal lists them, so the free list fragments while ranges are reserved.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import NamedTuple

from kvstore.meta import recovery
from kvstore.meta.records import ObjectRecord, SegmentRecord
from kvstore.meta.segments import pack_location
from kvstore.meta.state import MetaState
from kvstore.types import Endpoint, SegmentInfo, Tier

BLOCK_SIZE = 64 << 10
RUNS = 3
SIZES = (10**4, 10**5, 10**6)
_NUMBER = 1


class Timing(NamedTuple):
    blocks: int
    min_s: float
    median_s: float
    max_s: float


def records(blocks: int, seed: int = 0) -> tuple[SegmentRecord, list[tuple[str, ObjectRecord]]]:
    """A segment holding `blocks` blocks back to back, and their records in shuffled order."""
    info = SegmentInfo("bench-seg", "bench-daemon", Tier.DRAM, blocks * BLOCK_SIZE, (Endpoint("tcp", "127.0.0.1:1"),))
    slots = list(range(blocks))
    random.Random(seed).shuffle(slots)
    objects = [
        (f"bench-key-{i:08d}", ObjectRecord(BLOCK_SIZE, i, 1, (pack_location(_NUMBER, slot * BLOCK_SIZE),)))
        for i, slot in enumerate(slots)
    ]
    return SegmentRecord(_NUMBER, info), objects


def restore_seconds(segment: SegmentRecord, objects: list[tuple[str, ObjectRecord]]) -> float:
    st = MetaState()
    begun = time.perf_counter()
    report = recovery.restore(st, [segment], objects, [], {}, 0.0, 0.0)
    took = time.perf_counter() - begun
    if report.objects != len(objects):
        raise AssertionError(f"restored {report.objects} of {len(objects)} objects")
    return took


def measure(blocks: int, runs: int = RUNS) -> Timing:
    segment, objects = records(blocks)
    times = [restore_seconds(segment, objects) for _ in range(runs)]
    return Timing(blocks, min(times), statistics.median(times), max(times))


def main(argv: list[str]) -> None:
    for blocks in [int(a) for a in argv] or SIZES:
        t = measure(blocks)
        print(f"restore {t.blocks:>9,d} blocks: min {t.min_s:8.3f} s  median {t.median_s:8.3f} s  max {t.max_s:8.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
