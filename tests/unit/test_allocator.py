import random

import pytest

from kvstore.meta.allocator import OffsetAllocator


def allocate(a: OffsetAllocator, size: int) -> int:
    offset = a.allocate(size)
    assert offset is not None, f"no room for {size} bytes"
    return offset


def test_allocate_free_coalesces_back_to_one_block():
    a = OffsetAllocator(1 << 20, alignment=64)
    offs = [allocate(a, 1000) for _ in range(100)]
    assert len(set(offs)) == 100
    a.check_invariants([(o, 1000) for o in offs])
    for o in offs[::2] + offs[1::2]:
        a.free(o, 1000)
        a.check_invariants()
    assert a.used == 0 and a.largest_free() == a.capacity


def test_full_segment_returns_none_and_recovers():
    a = OffsetAllocator(4096, alignment=64)
    offs = [allocate(a, 64) for _ in range(64)]
    assert a.allocate(1) is None
    a.free(offs[10], 64)
    assert a.allocate(64) == offs[10]


def test_double_free_is_refused():
    a = OffsetAllocator(4096)
    o = allocate(a, 100)
    a.free(o, 100)
    with pytest.raises(ValueError):
        a.free(o, 100)


def test_random_workload_keeps_invariants():
    rng = random.Random(7)
    a = OffsetAllocator(8 << 20, alignment=64)
    live: dict[int, int] = {}
    for step in range(3000):
        if live and (rng.random() < 0.45 or a.free_bytes < 1 << 20):
            o = rng.choice(list(live))
            a.free(o, live.pop(o))
        else:
            size = rng.choice([1, 63, 64, 4096, 70_000, 1 << 20])
            got = a.allocate(size)
            if got is not None:
                live[got] = size
        if step % 100 == 0:
            a.check_invariants(live.items())
    a.check_invariants(live.items())
