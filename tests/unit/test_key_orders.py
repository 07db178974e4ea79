"""Work under the store's lock costs what it returns or evicts, not the number of keys stored:
a tenant at its quota walks only its own keys; a ListKeys page costs its own keys, so paging a
store is linear. Work is counted (predicate calls, Python lines run), never timed."""

from __future__ import annotations

import random
import sys
from types import FrameType
from typing import Any

import pytest

import kvstore.meta
from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.eviction import LRUEviction
from kvstore.meta.store import MetaStore
from kvstore.server.handlers import MetaHandlers
from kvstore.types import Tier
from tests.meta_helpers import SIGNER, commit, segment
from tests.unit.test_tenants import add, principal, put

KIB = 1024


class CountingLRU(LRUEviction):
    """LRU that counts the candidates it was asked to consider."""

    def __init__(self) -> None:
        self.asked = 0

    def victims(self, index, protected, bytes_needed):
        def counted(key: str) -> bool:
            self.asked += 1
            return protected(key)

        return super().victims(index, counted, bytes_needed)


def test_a_tenant_at_its_quota_walks_only_its_own_keys(tmp_path):
    policy = CountingLRU()
    store = MetaStore(MetaConfig(), SIGNER, FakeClock(), policy=policy)
    store.mount_segment(segment("s1", "d1", Tier.DRAM, 64 << 20))
    h = MetaHandlers(store)
    add(h, "big")
    add(h, "small", quotas={Tier.DRAM: 4 * KIB})
    big, small = principal(h, "big"), principal(h, "small")
    for start in range(0, 8000, 1000):
        put(h, big, [f"k/{i}" for i in range(start, start + 1000)])
    put(h, small, [f"s/{i}" for i in range(4)])  # at its quota, older than none of big's
    put(h, big, [f"k/late/{i}" for i in range(1000)])
    policy.asked = 0
    assert put(h, small, ["s/4"])[0] == [ErrorCode.OK]  # evicts its own oldest
    assert policy.asked <= 4, f"a put at quota asked about {policy.asked} keys of 9,004 stored"
    store.check_invariants()


def _lines_listing_all(keys: int, page: int) -> int:
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("s1", "d1", Tier.DRAM, keys * 8192))
    names = [f"key/{i:08d}" for i in range(keys)]
    random.Random(3).shuffle(names)
    for start in range(0, keys, 1000):
        part = names[start : start + 1000]
        commit(store, part, store.put_start(part, [64] * len(part)).results)
    package = kvstore.meta.__path__[0]
    lines, cursor = 0, ""
    seen: list[str] = []

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if not frame.f_code.co_filename.startswith(package):
            return None
        lines += event == "line"
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        while True:
            listing = store.list_keys("key/", page, cursor)
            seen += listing.keys
            cursor = listing.next_cursor
            if not cursor:
                break
    finally:
        sys.settrace(previous)
    assert seen == sorted(names)
    return lines


def test_paging_through_a_store_is_linear_in_its_keys():
    small, large = _lines_listing_all(2000, 100), _lines_listing_all(8000, 100)
    assert large / small < 5, f"4x the keys cost {large / small:.1f}x the work ({small} -> {large} lines)"


@pytest.mark.parametrize("seed", range(20))
def test_a_page_is_what_a_sort_of_every_key_says(seed):
    from kvstore.meta.orders import KeyOrders

    rng = random.Random(seed)
    orders = KeyOrders()
    keys = {
        rng.choice(["", "\x001\x00", "\x002\x00"]) + "".join(rng.choice("ab/x") for _ in range(rng.randint(1, 5)))
        for _ in range(200)
    }
    for key in keys:
        orders.added(key)
    for key in rng.sample(sorted(keys), 30):
        orders.removed(key)
        keys.discard(key)
    prefix = rng.choice(["", "a", "b/", "\0", "\x001\x00"])
    hidden = rng.choice(["", "\0", "ab", "\x002"])
    cursor = rng.choice(["", "a", "b", *sorted(keys)[:3]])
    limit = rng.randint(1, 20)
    expected = sorted(k for k in keys if k.startswith(prefix) and k > cursor and not (hidden and k.startswith(hidden)))
    assert orders.page(prefix, cursor, limit, hidden) == (expected[:limit], len(expected) > limit)
