"""Demotion, promotion, SSD deletion, pins and re-announcement, driven by a fake clock."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.grant import GrantSigner
from kvstore.meta.store import MetaStore
from kvstore.results import Block, MoveOutcome
from kvstore.types import Endpoint, MoveKind, SegmentInfo, Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment

DRAM, SSD = 64 * 1024, 256 * 1024
BLOCK = 4096


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    cfg = MetaConfig(
        lease_ttl_s=5,
        high_watermark=0.75,
        low_watermark=0.5,
        ssd_high_watermark=0.9,
        ssd_low_watermark=0.8,
        promote_after_hits=2,
        pin_cap=0.5,
        move_timeout_s=10,
    )
    s = MetaStore(cfg, SIGNER, clock)
    s.mount_segment(segment("dram", "d1", Tier.DRAM, DRAM))
    s.mount_segment(segment("ssd", "d1", Tier.SSD, SSD))
    yield s
    s.check_invariants()


def put(store, keys, size=BLOCK):
    res = store.put_start(keys, [size] * len(keys)).results
    commit(store, keys, res, checksum=1)
    store.check_invariants()
    return res


def tier_of(store, key):
    [g] = store.get([key], client_host=HOST).results[0].grants  # a shm reader: LOCAL, no grant left behind
    return g.segment_id


def run_moves(store, daemon="d1", fail=()):
    tasks = store.claim_moves(daemon, 1 << 30)
    store.check_invariants()
    store.complete_moves(
        daemon, [MoveOutcome(t.move_id, t.key not in fail, "copy failed" if t.key in fail else "") for t in tasks]
    )
    store.check_invariants()
    return tasks


def test_cold_blocks_are_demoted_not_dropped(store):
    keys = [f"k{i}" for i in range(14)]  # 14 x 4 KiB = 56 KiB > 75% of 64 KiB
    put(store, keys)
    tasks = run_moves(store)
    assert tasks and all(t.kind is MoveKind.DEMOTE for t in tasks)
    assert [t.key for t in tasks] == keys[: len(tasks)]  # least recently used first
    assert store.exists(keys) == [True] * 14  # nothing lost
    assert tier_of(store, keys[0]) == "ssd" and tier_of(store, keys[-1]) == "dram"
    stats = {t.tier: t for t in store.stats().tiers}
    assert stats[Tier.SSD].demotions == len(tasks) and stats[Tier.SSD].blocks == len(tasks)
    assert stats[Tier.DRAM].used <= DRAM * 0.5


def test_full_dram_asks_puts_to_retry_until_demotion_frees_room(store):
    put(store, [f"k{i}" for i in range(16)])  # DRAM completely full
    [r] = store.put_start(["late"], [BLOCK]).results
    assert r.code is ErrorCode.NO_SPACE and r.retry_after_ms > 0
    run_moves(store)
    assert put(store, ["late"])[0].code is ErrorCode.OK


def test_read_during_move_abandons_it(store):
    put(store, [f"k{i}" for i in range(14)])
    tasks = store.claim_moves("d1", 1 << 30)
    victim = tasks[0].key
    store.get([victim])  # a reader now holds a DRAM grant
    store.complete_moves("d1", [MoveOutcome(t.move_id, True, "") for t in tasks])
    store.check_invariants()
    assert tier_of(store, victim) == "dram"  # the reader's bytes stayed put
    assert tier_of(store, tasks[1].key) == "ssd"


def test_remove_during_move_and_failed_copy(store):
    put(store, [f"k{i}" for i in range(14)])
    tasks = store.claim_moves("d1", 1 << 30)
    store.remove([tasks[0].key])
    store.complete_moves(
        "d1", [MoveOutcome(tasks[0].move_id, True, ""), MoveOutcome(tasks[1].move_id, False, "disk error")]
    )
    store.check_invariants()
    assert store.exists([tasks[0].key, tasks[1].key]) == [False, True]
    assert tier_of(store, tasks[1].key) == "dram"


def test_unreported_moves_expire(store, clock):
    put(store, [f"k{i}" for i in range(14)])
    tasks = store.claim_moves("d1", 1 << 30)
    used = store.stats().used
    clock.advance(11)
    store.heartbeat("d1", [])
    store.tick()
    assert store.stats().used == used - len(tasks) * BLOCK  # destinations freed
    store.complete_moves("d1", [MoveOutcome(t.move_id, True, "") for t in tasks])  # too late: ignored
    assert tier_of(store, tasks[0].key) == "dram"


def test_hot_ssd_block_is_promoted(store, clock):
    put(store, [f"k{i}" for i in range(14)])
    run_moves(store)
    store.remove([f"k{i}" for i in range(8, 14)], force=True)  # room in DRAM again
    clock.advance(6)
    store.tick()
    store.get(["k0"])
    store.get(["k0"])  # second hit on SSD
    clock.advance(6)  # lease over: the move may switch
    tasks = run_moves(store)
    assert [(t.kind, t.key) for t in tasks] == [(MoveKind.PROMOTE, "k0")]
    assert tier_of(store, "k0") == "dram"
    assert {t.tier: t for t in store.stats().tiers}[Tier.DRAM].promotions == 1


def test_full_ssd_deletes_least_recently_used(store):
    n = (DRAM + SSD) // BLOCK  # write far more than both tiers hold
    for i in range(2 * n):
        res = put(store, [f"k{i}"])
        if res[0].code is ErrorCode.NO_SPACE:
            run_moves(store)
            assert put(store, [f"k{i}"])[0].code is ErrorCode.OK
    stats = store.stats()
    ssd = {t.tier: t for t in stats.tiers}[Tier.SSD]
    assert ssd.used <= SSD * 0.9 and ssd.evictions > 0
    assert stats.keys + stats.evictions == 2 * n  # every block is stored or was evicted
    alive = store.exists([f"k{i}" for i in range(2 * n)])
    assert not any(alive[: n // 2]) and all(alive[-10:])  # the oldest went first


def test_pins_protect_and_are_capped(store):
    put(store, [f"k{i}" for i in range(14)])
    assert store.pin(["k0", "k1"], ttl_s=100) == store.pin(["k0"], ttl_s=100)[:1] * 2
    assert store.pin(["missing"], 10)[0].code is ErrorCode.KEY_NOT_FOUND
    results = store.pin([f"k{i}" for i in range(2, 14)], ttl_s=100)  # cap: half of 64 KiB = 8 blocks
    assert [r.code for r in results].count(ErrorCode.OK) == 6 and results[-1].code is ErrorCode.NO_SPACE
    tasks = run_moves(store)
    assert tasks and not {t.key for t in tasks} & {f"k{i}" for i in range(8)}
    assert tier_of(store, "k0") == "dram"
    assert store.unpin(["k0"])[0].code is ErrorCode.OK
    assert store.stats().pinned >= 2


def test_announce_reserves_exact_ranges(store):
    ok = store.announce("ssd", [Block("a", 0, 100, 5), Block("b", 8192, 5000, 6)])
    assert [r.code for r in ok] == [ErrorCode.OK, ErrorCode.OK]
    clash = store.announce("ssd", [Block("c", 4096, 8192, 7), Block("a", 40960, 10, 1)])
    assert [r.code for r in clash] == [ErrorCode.INVALID_ARGUMENT, ErrorCode.ALREADY_EXISTS]
    [g] = store.get(["b"]).results
    assert (g.size, g.checksum, g.grants[0].offset) == (5000, 6, 8192)


def test_restarted_daemon_takes_over_its_persistent_segment(store):
    store.announce("ssd", [Block("a", 0, 100, 5)])
    ep = (Endpoint("tcp", "127.0.0.1:2"),)
    store.mount_segment(SegmentInfo("ssd", "d2", Tier.SSD, SSD, ep))  # same id, new daemon
    assert store.exists(["a"]) == [False]  # it re-announces what survived
    assert store.announce("ssd", [Block("a", 0, 100, 5)])[0].code is ErrorCode.OK


def test_daemons_without_ssd_still_evict_while_others_demote(clock):
    cfg = MetaConfig(high_watermark=0.75, low_watermark=0.5)
    s = MetaStore(cfg, GrantSigner(b"k" * 16), clock)
    ep = (Endpoint("tcp", "127.0.0.1:1"),)
    s.mount_segment(SegmentInfo("dram2", "d2", Tier.DRAM, DRAM, ep))
    s.mount_segment(SegmentInfo("ssd2", "d2", Tier.SSD, SSD, ep))
    old = [f"old{i}" for i in range(16)]
    put(s, old)  # d2's DRAM is full, and least recent
    s.mount_segment(SegmentInfo("plain", "d1", Tier.DRAM, DRAM, ep))
    for i in range(40):  # all land on d1, which has no SSD
        assert put(s, [f"new{i}"])[0].code is ErrorCode.OK
    stats = {t.tier: t for t in s.stats().tiers}
    assert stats[Tier.DRAM].evictions > 0  # d1 dropped its own LRU blocks ...
    assert s.exists(old) == [True] * 16  # ... never d2's, older as they are
    run_moves(s, "d2")  # d2 makes room by demoting them
    assert {t.tier: t for t in s.stats().tiers}[Tier.SSD].demotions > 0
    assert s.exists(old) == [True] * 16
    s.check_invariants()
