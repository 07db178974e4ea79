"""The GPU tier in the metadata service: puts fill it first, its least recently used blocks are
demoted to DRAM (and on to SSD), hot DRAM blocks come back, and a GPU with nowhere below to go
evicts. Driven by a fake clock; the bytes side is tests/integration/test_gpu_tier.py."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.store import MetaStore
from kvstore.results import MoveOutcome
from kvstore.types import MoveKind, Tier
from tests.meta_helpers import HOST, SIGNER, segment
from tests.unit.test_tiering import put, run_moves

GPU, DRAM, SSD = 64 * 1024, 128 * 1024, 512 * 1024


@pytest.fixture
def clock():
    return FakeClock()


def make(clock, gpu=GPU, dram=DRAM, ssd=0, daemon="d1"):
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
    if gpu:
        s.mount_segment(segment("gpu", daemon, Tier.GPU, gpu))
    if dram:
        s.mount_segment(segment("dram", daemon, Tier.DRAM, dram))
    if ssd:
        s.mount_segment(segment("ssd", daemon, Tier.SSD, ssd))
    return s


@pytest.fixture
def store(clock):
    s = make(clock)
    yield s
    s.check_invariants()


def tiers(store, keys):
    """Each key's tier, read without counting as a hit (Exists would not say; the index does)."""
    out = []
    for key in keys:
        entry = store._st.index.get(key)
        out.append(None if entry is None else store._st.tier_of(entry.replicas()[0]).value)
    return out


def stats(store):
    return {t.tier: t for t in store.stats().tiers}


def test_puts_fill_the_gpu_then_its_coldest_blocks_go_to_dram(store):
    keys = [f"k{i}" for i in range(16)]
    put(store, keys)  # 16 x 4 KiB: the GPU is full
    assert tiers(store, keys) == ["gpu"] * 16
    tasks = run_moves(store)
    assert tasks and all(t.kind is MoveKind.DEMOTE for t in tasks)
    assert [t.key for t in tasks] == keys[: len(tasks)]  # least recently used first
    assert tiers(store, keys) == ["dram"] * len(tasks) + ["gpu"] * (16 - len(tasks))
    s = stats(store)
    assert s[Tier.GPU].used <= GPU * 0.5 and s[Tier.DRAM].demotions == len(tasks)
    assert store.exists(keys) == [True] * 16 and store.stats().evictions == 0
    put(store, ["new"])
    assert tiers(store, ["new"]) == ["gpu"]  # room again for the newest


def test_a_hot_dram_block_is_promoted_back_to_the_gpu(store, clock):
    keys = [f"k{i}" for i in range(16)]
    put(store, keys)
    run_moves(store)
    assert tiers(store, ["k0"]) == ["dram"]
    store.get(["k0"], client_host=HOST)
    store.get(["k0"], client_host=HOST)  # second hit: queued for the GPU
    clock.advance(6)  # its read lease is over
    tasks = run_moves(store)
    assert [(t.kind, t.key, t.dst_segment_id) for t in tasks] == [(MoveKind.PROMOTE, "k0", "gpu")]
    assert tiers(store, ["k0"]) == ["gpu"] and stats(store)[Tier.GPU].promotions == 1


def test_leased_and_pinned_blocks_stay_on_the_gpu(store, clock):
    keys = [f"k{i}" for i in range(16)]
    put(store, keys)
    assert store.pin(["k0"], ttl_s=100)[0].code is ErrorCode.OK
    store.get(["k1"])  # a reader holds k1
    tasks = run_moves(store)
    assert tasks and not {t.key for t in tasks} & {"k0", "k1"}
    assert tiers(store, ["k0", "k1"]) == ["gpu", "gpu"]


def test_a_demotion_read_meanwhile_is_abandoned(store):
    put(store, [f"k{i}" for i in range(16)])
    tasks = store.claim_moves("d1", 1 << 30)
    store.get([tasks[0].key])  # a reader now holds a GPU grant
    store.complete_moves("d1", [MoveOutcome(t.move_id, True, "") for t in tasks])
    store.check_invariants()
    assert tiers(store, [tasks[0].key, tasks[1].key]) == ["gpu", "dram"]


def test_no_room_in_dram_evicts_the_gpu_copy(clock):
    s = make(clock, dram=16 * 1024)
    keys = [f"k{i}" for i in range(16)]
    put(s, keys)  # the GPU is full
    put(s, ["x0", "x1", "x2"])  # DRAM at its watermark
    assert tiers(s, ["x0"]) == ["dram"]
    run_moves(s)
    s.tick()
    assert stats(s)[Tier.GPU].used <= GPU * 0.5 and s.stats().evictions > 0
    assert s.stats().keys + s.stats().evictions == 19  # every block is stored or was evicted
    # DRAM took the coldest (k0) while it had room; the next seven were evicted; the newest stayed
    assert tiers(s, keys) == ["dram"] + [None] * 7 + ["gpu"] * 8
    s.check_invariants()


def test_gpu_to_dram_to_ssd_loses_nothing(clock):
    s = make(clock, ssd=SSD)
    keys = [f"k{i}" for i in range(40)]  # 160 KiB through 64 KiB GPU + 128 KiB DRAM
    for key in keys:
        if put(s, [key])[0].code is ErrorCode.NO_SPACE:  # DRAM full: the put waits for demotion
            run_moves(s)
            assert put(s, [key])[0].code is ErrorCode.OK
        run_moves(s)
    while run_moves(s):
        pass
    st = stats(s)
    assert s.exists(keys) == [True] * 40 and s.stats().evictions == 0
    assert st[Tier.GPU].used <= GPU * 0.75 and st[Tier.DRAM].used <= DRAM * 0.75
    assert st[Tier.DRAM].demotions > 0 and st[Tier.SSD].demotions > 0
    assert tiers(s, keys[-1:]) == ["gpu"] and tiers(s, keys[:1]) == ["ssd"]
    s.check_invariants()


def test_a_gpu_only_daemon_evicts_past_the_watermark(clock):
    s = make(clock, dram=0, daemon="g")
    keys = [f"k{i}" for i in range(16)]
    put(s, keys)
    s.tick()
    assert stats(s)[Tier.GPU].used <= GPU * 0.5
    assert s.exists(keys) == [False] * 8 + [True] * 8
    s.check_invariants()
