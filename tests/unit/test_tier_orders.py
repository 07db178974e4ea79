"""Making room in some segments walks only the keys in them, not every key stored: a demotion
claim, SSD room for it, the SSD and DRAM watermarks, room for a put and the "retry: demoting"
answer each ask about a handful of keys while thousands of older ones live on another daemon or
tier. Work is counted (keys asked about), never timed. And the orders per segment are the index's
recency order, restricted to those segments, whatever the index went through."""

from __future__ import annotations

import random

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.index import ObjectIndex
from kvstore.meta.segments import pack_location
from kvstore.meta.store import MetaStore
from kvstore.results import Block
from kvstore.types import MoveKind, Tier
from tests.meta_helpers import SIGNER, commit, segment

BLOCK = 4096
OTHERS = 3000  # keys elsewhere, older than every key the call may take
FULL = 20  # blocks a full DRAM (or SSD) holds


@pytest.fixture
def store():
    s = MetaStore(MetaConfig(), SIGNER, FakeClock())
    yield s
    s.check_invariants()


def put(store: MetaStore, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        part = keys[start : start + 1000]
        results = store.put_start(part, [BLOCK] * len(part)).results
        assert all(r.code is ErrorCode.OK for r in results)
        commit(store, part, results)


def announce(store: MetaStore, segment_id: str, keys: list[str]) -> None:
    for start in range(0, len(keys), 1000):
        blocks = [Block(k, (start + i) * BLOCK, BLOCK, 1) for i, k in enumerate(keys[start : start + 1000])]
        assert all(r.code is ErrorCode.OK for r in store.announce(segment_id, blocks))


def asked(store: MetaStore) -> list[int]:
    """A counter (its one item) of the keys eviction and demotion ask `protected` about from now on:
    every key they walk, whether they take it or not."""
    st = store._st
    protected, count = st.protected, [0]

    def counting(now: float):
        inner = protected(now)

        def ask(key: str) -> bool:
            count[0] += 1
            return inner(key)

        return ask

    st.protected = counting  # type: ignore[method-assign]
    return count


def others_on_ssd(store: MetaStore, daemon: str = "d2") -> list[str]:
    """OTHERS blocks on `daemon`'s SSD (half full): the oldest keys of the store."""
    store.mount_segment(segment(f"ssd-{daemon}", daemon, Tier.SSD, 2 * OTHERS * BLOCK))
    keys = [f"other/{i}" for i in range(OTHERS)]
    announce(store, f"ssd-{daemon}", keys)
    return keys


def others_in_dram(store: MetaStore) -> list[str]:
    """OTHERS blocks in the DRAM of d2, a daemon without SSD."""
    store.mount_segment(segment("dram-d2", "d2", Tier.DRAM, OTHERS * BLOCK))
    keys = [f"other/{i}" for i in range(OTHERS)]
    put(store, keys)
    return keys


def test_a_demotion_claim_walks_only_the_daemons_dram(store):
    others_on_ssd(store, "d1")  # the claiming daemon's own SSD: older than its DRAM
    store.mount_segment(segment("dram-d1", "d1", Tier.DRAM, FULL * BLOCK))
    put(store, [f"k{i}" for i in range(FULL)])
    count = asked(store)
    [task] = store.claim_moves("d1", BLOCK)
    assert (task.kind, task.key) == (MoveKind.DEMOTE, "k0")
    assert count[0] <= 2, f"a one-block demotion asked about {count[0]} keys of {OTHERS + FULL}"


def test_ssd_room_for_a_demotion_walks_only_the_daemons_ssd(store):
    others_on_ssd(store)  # d2's SSD: older than anything on d1
    store.mount_segment(segment("dram-d1", "d1", Tier.DRAM, FULL * BLOCK))
    store.mount_segment(segment("ssd-d1", "d1", Tier.SSD, FULL * BLOCK))
    announce(store, "ssd-d1", [f"s{i}" for i in range(FULL - 1)])  # at its high watermark, not past it
    results = store.put_start([f"k{i}" for i in range(FULL // 2)], [2 * BLOCK] * (FULL // 2)).results
    commit(store, [f"k{i}" for i in range(FULL // 2)], results)  # DRAM full of blocks the SSD has no room for
    count = asked(store)
    store.claim_moves("d1", 2 * BLOCK)
    assert store.exists(["s0", "s1", "s2"]) == [False, False, True]  # the SSD's least recently used made room
    assert count[0] <= 4, f"a demotion and its SSD room asked about {count[0]} keys of {OTHERS + FULL}"


def test_the_ssd_watermark_walks_only_ssd_keys(store):
    others_in_dram(store)
    store.mount_segment(segment("ssd-d1", "d1", Tier.SSD, FULL * BLOCK))
    announce(store, "ssd-d1", [f"s{i}" for i in range(FULL)])  # past the SSD's high watermark
    count = asked(store)
    store.tick()
    assert store.exists(["s0", "s1", "s2"]) == [False, False, True]  # down to its low watermark
    assert count[0] <= 4, f"the SSD watermark asked about {count[0]} keys of {OTHERS + FULL}"


def test_the_dram_watermark_walks_only_daemons_without_ssd(store):
    others_on_ssd(store, "d1")  # a daemon that demotes: its blocks are not the watermark's to drop
    store.mount_segment(segment("dram-d2", "d2", Tier.DRAM, FULL * BLOCK))
    put(store, [f"k{i}" for i in range(FULL)])
    count = asked(store)
    store.tick()
    assert store.exists(["k0", "k1", "k2", "k3"]) == [False, False, False, True]  # down to 85%
    assert count[0] <= 5, f"the DRAM watermark asked about {count[0]} keys of {OTHERS + FULL}"


def test_room_for_a_put_walks_only_the_daemons_it_may_place_on(store):
    others_on_ssd(store)  # d2: SSD only
    store.mount_segment(segment("dram-d1", "d1", Tier.DRAM, FULL * BLOCK))
    put(store, [f"k{i}" for i in range(FULL)])  # full
    count = asked(store)
    put(store, ["late"])  # room for it (one block), then the DRAM watermark the put checks (three)
    assert store.exists(["late", "k0", "k3", "k4"]) == [True, False, False, True]
    assert count[0] <= 5, f"room for one put asked about {count[0]} keys of {OTHERS + FULL}"


def test_a_put_told_to_wait_for_demotion_walks_only_dram_that_demotes(store):
    others_on_ssd(store)  # d2: SSD only
    store.mount_segment(segment("dram-d1", "d1", Tier.DRAM, FULL * BLOCK))
    store.mount_segment(segment("ssd-d1", "d1", Tier.SSD, 2 * FULL * BLOCK))
    put(store, [f"k{i}" for i in range(FULL)])  # full, and demotes: no put evicts from it
    count = asked(store)
    [r] = store.put_start(["late"], [BLOCK]).results
    assert r.code is ErrorCode.NO_SPACE and r.retry_after_ms > 0
    assert count[0] <= 1, f"a put told to retry asked about {count[0]} keys of {OTHERS + FULL}"


# -- the orders themselves ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_a_segments_order_is_the_index_order_restricted_to_it(seed):
    rng = random.Random(seed)
    index, numbers, offsets = ObjectIndex(), range(1, 6), iter(range(1, 1 << 20))

    def places(n: int) -> tuple[int, ...]:
        return tuple(pack_location(s, next(offsets)) for s in rng.sample(numbers, n))

    for step in range(400):
        keys = list(index.least_recent())
        op = rng.random()
        if op < 0.35 or not keys:
            key = f"k{step}"
            if rng.random() < 0.5:
                index.insert_complete(key, places(rng.randint(1, 3)), 64, 1)
            else:
                index.begin_put(key, 64, places(rng.randint(1, 3)), 0.0)
                index.commit(key, 1)
        elif op < 0.6:
            index.touch(rng.choice(keys)[0])
        elif op < 0.85:
            index.set_replicas(rng.choice(keys)[0], places(rng.randint(1, 3)))  # moved, copied, lost
        else:
            index.remove(rng.choice(keys)[0])
        index.check_invariants()
        chosen = set(rng.sample(numbers, rng.randint(1, 3)))
        expected = [k for k, e in index.least_recent() if e.segments() & chosen]
        assert [k for k, _ in index.least_recent_in(chosen)] == expected


def test_the_invariant_check_sees_a_segment_order_out_of_date():
    index = ObjectIndex()
    index.insert_complete("a", (pack_location(1, 0),), 64, 1)
    index.insert_complete("b", (pack_location(1, 64), pack_location(2, 0)), 64, 1)
    index.check_invariants()
    index.by_segment.discard("b", {2})  # behind the index's back
    with pytest.raises(AssertionError, match="lost a key"):
        index.check_invariants()
