"""Each tier's own eviction policy and admission (`--eviction`, `--admission`): the settings, and
what the store does with them, driven by a fake clock."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.config.tierspec import parse_tiers
from kvstore.errors import InvalidArgument
from kvstore.meta.admission import AdmitReused
from kvstore.meta.eviction import LRUEviction
from kvstore.meta.eviction_arc import ARCEviction
from kvstore.meta.store import MetaStore
from kvstore.meta.tierpolicy import Watchers
from kvstore.results import MoveOutcome
from kvstore.types import MoveKind, Tier
from tests.meta_helpers import SIGNER, commit, segment

DRAM, SSD = 64 * 1024, 256 * 1024
BLOCK = 4096
GPU, DRAM_T, SSD_T = Tier.GPU, Tier.DRAM, Tier.SSD


@pytest.mark.parametrize(
    ("setting", "want"),
    [
        ("arc", {GPU: "arc", DRAM_T: "arc", SSD_T: "arc"}),
        ("ssd=arc", {GPU: "lru", DRAM_T: "lru", SSD_T: "arc"}),
        ("arc,ssd=lru", {GPU: "arc", DRAM_T: "arc", SSD_T: "lru"}),
        ("ssd=lru, arc", {GPU: "arc", DRAM_T: "arc", SSD_T: "lru"}),  # TIER=NAME wins wherever it stands
        ("DRAM=arc,gpu=arc", {GPU: "arc", DRAM_T: "arc", SSD_T: "lru"}),
    ],
)
def test_a_setting_names_every_tier_or_some(setting, want):
    assert parse_tiers(setting, ("lru", "arc"), "lru", "eviction") == want


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"eviction": "fifo"}, "'fifo' is not one of lru, arc"),
        ({"eviction": ""}, "'' is not one of lru, arc"),
        ({"eviction": "tape=lru"}, "'tape' is not a tier it applies to (one of gpu, dram, ssd)"),
        ({"admission": "ssd=maybe"}, "'maybe' is not one of all, reused"),
        ({"admission": "gpu=reused"}, "'gpu' is not a tier it applies to (one of dram, ssd)"),
    ],
)
def test_a_bad_setting_is_refused_with_what_would_do(fields, says):
    with pytest.raises(InvalidArgument) as err:
        MetaConfig(**fields)
    assert says in str(err.value)


def store_with(clock, ssd=True, **fields):
    cfg = MetaConfig(lease_ttl_s=5, high_watermark=0.75, low_watermark=0.5, promote_after_hits=100, **fields)
    s = MetaStore(cfg, SIGNER, clock)
    s.mount_segment(segment("dram", "d1", Tier.DRAM, DRAM))
    if ssd:
        s.mount_segment(segment("ssd", "d1", Tier.SSD, SSD))
    return s


def put(store, keys):
    res = store.put_start(keys, [BLOCK] * len(keys)).results
    commit(store, keys, res, checksum=1)
    store.check_invariants()


def read(store, clock, keys):
    """A read of each key, its lease then over."""
    store.get(keys)
    clock.advance(6)
    store.tick()


def test_one_policy_object_per_name_and_every_stateful_one_hears_the_index():
    clock = FakeClock()
    s = store_with(clock, eviction="lru,ssd=arc", admission="ssd=reused")
    policies = s._policies
    assert isinstance(policies.evicts(DRAM_T), LRUEviction) and policies.evicts(GPU) is policies.evicts(DRAM_T)
    assert isinstance(policies.evicts(SSD_T), ARCEviction)
    assert isinstance(policies.admission[SSD_T], AdmitReused) and policies.admits(DRAM_T, "anything")
    assert isinstance(s._st.index.watcher, Watchers)  # ARC and the admission both keep state
    put(s, ["a", "b"])
    read(s, clock, ["a"])
    assert policies.admits(SSD_T, "a") and not policies.admits(SSD_T, "b")
    assert list(policies.evicts(SSD_T).t2) == ["a"]  # the same events reached ARC
    s.check_invariants()


@pytest.mark.parametrize(("eviction", "first"), [("lru", "read"), ("ssd=arc", "read"), ("dram=arc", "unread")])
def test_dram_evicts_by_its_own_policy_only(eviction, first):
    clock = FakeClock()
    s = store_with(clock, ssd=False, eviction=eviction)  # no SSD: DRAM evicts by its watermarks
    read_keys, unread = [f"r{i}" for i in range(4)], [f"u{i}" for i in range(9)]
    put(s, read_keys)
    read(s, clock, read_keys)  # read, then older than every unread key
    for key in unread:  # one at a time (a PENDING put is no candidate); 13 blocks: past 75 % of 16
        put(s, [key])
    s.tick()
    s.check_invariants()
    keys = read_keys + unread
    gone = [k for k, alive in zip(keys, s.exists(keys), strict=True) if not alive]
    assert len(gone) >= 4  # down to 50 % of 16 blocks, with what the put itself needs
    if first == "read":  # LRU: the least recently used, the four read ones first
        assert gone == keys[: len(gone)]
    else:  # ARC: blocks stored and not read since go first, newer as they are
        assert gone == unread[: len(gone)]


def run_moves(store):
    tasks = store.claim_moves("d1", 1 << 30)
    store.complete_moves("d1", [MoveOutcome(t.move_id, True, "") for t in tasks])
    store.check_invariants()
    return tasks


@pytest.mark.parametrize("admission", ["all", "ssd=reused", "reused"])
def test_ssd_admission_decides_what_a_demotion_writes(admission):
    clock = FakeClock()
    s = store_with(clock, admission=admission)
    unread, read_keys, newer = ["u0", "u1", "u2"], ["r0", "r1", "r2"], [f"n{i}" for i in range(8)]
    put(s, unread + read_keys)
    read(s, clock, read_keys)
    put(s, newer)  # 14 blocks, past 75 %: 6 leave DRAM, oldest first (the unread, then the read)
    tasks = run_moves(s)
    tiers = {t.tier: t for t in s.stats().tiers}
    assert all(t.kind is MoveKind.DEMOTE for t in tasks)
    assert s.exists(read_keys + newer) == [True] * 11
    if admission == "all":
        assert sorted(t.key for t in tasks) == sorted(unread + read_keys)
        assert s.exists(unread) == [True] * 3 and tiers[DRAM_T].evictions == 0
    else:  # SSD takes only what was read since stored; the rest is evicted, not written
        assert sorted(t.key for t in tasks) == sorted(read_keys)
        assert s.exists(unread) == [False] * 3 and tiers[DRAM_T].evictions == 3
        assert s._st.counters["demotions_refused"] == 3
    assert tiers[SSD_T].demotions == len(tasks)


def test_a_key_stored_again_is_not_read_since():
    admission = AdmitReused()
    admission.added("k")
    admission.used("k")
    assert admission.admits("k")
    admission.removed("k")
    admission.added("k")  # evicted and put again
    assert not admission.admits("k")
    admission.used("k")
    admission.added("k")  # a restarted daemon announced it again: new to the index
    assert not admission.admits("k")
