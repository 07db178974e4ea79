"""The eviction seam and ARC (`--eviction arc`): the policy alone against hand-computed cases, the
store running it with check_invariants() after every step (its lists hold exactly the index's
keys), protected keys never chosen, and ARC beating LRU on a generated shared-prefix trace."""

import pytest

from kvstore.bench.trace.arcsim import StoreARC
from kvstore.bench.trace.sim import LRUCache, simulate
from kvstore.bench.trace.synth import SynthSpec, generate
from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import InvalidArgument
from kvstore.meta.eviction import LRUEviction, make_policy
from kvstore.meta.eviction_arc import SCOPE_SKIPS, ARCEviction
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.meta_helpers import SIGNER, commit, segment

BLOCK = 1024


class _Entry:
    size = BLOCK

    @staticmethod
    def replicas():
        return (0,)


class Everything:
    """A scope of every key the policy holds (as one DRAM tier is)."""

    def __init__(self, policy):
        self.policy = policy

    def least_recent(self):
        return iter(())

    def entry(self, key):
        return _Entry if key in self.policy.t1 or key in self.policy.t2 else None


def evict(policy, n, protected=lambda key: False):
    chosen = policy.victims(Everything(policy), protected, n * BLOCK)
    for key in chosen:
        policy.removed(key)
    return chosen


def test_keys_read_again_outlive_keys_stored_once():
    arc = ARCEviction()
    for key in "abcd":
        arc.added(key)
    arc.used("a")  # read: now in t2, the reused
    assert evict(arc, 2) == ["b", "c"]  # t1 (stored once) goes first, oldest first
    assert list(arc.t1) == ["d"] and list(arc.t2) == ["a"] and list(arc.b1) == [hash("b"), hash("c")]


def test_a_key_back_from_the_t1_ghosts_grows_the_recency_side():
    arc = ARCEviction()
    for key in "abc":
        arc.added(key)
    evict(arc, 1)  # a -> ghost b1
    assert arc.p == 0
    arc.added("a")  # stored again after it left unread: t1 was too short
    assert arc.p == 1 and "a" in arc.t2 and hash("a") not in arc.b1


def test_protected_keys_are_never_chosen_and_each_is_asked_once():
    arc = ARCEviction()
    for key in "abcdef":
        arc.added(key)
    arc.used("e")
    asked = []

    def protected(key):
        asked.append(key)
        return key in {"a", "e"}

    chosen = arc.victims(Everything(arc), protected, 5 * BLOCK)
    assert "a" not in chosen and "e" not in chosen
    assert chosen == ["b", "c", "d", "f"]  # all that may go: fewer bytes than asked
    assert sorted(asked) == sorted(set(asked))


def test_make_policy_and_the_config_name_the_policies():
    assert isinstance(make_policy("lru"), LRUEviction) and isinstance(make_policy("arc"), ARCEviction)
    with pytest.raises(InvalidArgument):
        make_policy("fifo")
    with pytest.raises(InvalidArgument):
        MetaConfig(eviction="fifo")


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    cfg = MetaConfig(lease_ttl_s=5, high_watermark=0.9, low_watermark=0.5, eviction="arc")
    s = MetaStore(cfg, SIGNER, clock)
    s.mount_segment(segment("s1", "d1", Tier.DRAM, 16 * BLOCK))
    yield s
    s.check_invariants()


def put(store, keys):
    res = store.put_start(keys, [BLOCK] * len(keys)).results
    store.check_invariants()
    commit(store, keys, res)
    store.check_invariants()


def test_the_store_under_arc_keeps_the_reused_and_its_lists_match_the_index(store, clock):
    put(store, ["hot"])
    store.get(["hot"])  # a read: ARC's t2
    clock.advance(6)  # the read lease ended
    store.tick()
    for i in range(40):
        put(store, [f"cold{i}"])
        if i % 3 == 0:
            store.remove([f"cold{i}"], force=True)
        store.check_invariants()
    assert store.exists(["hot"]) == [True]  # LRU would have evicted it long ago
    assert store.stats().evictions > 0


def test_the_store_under_arc_never_evicts_a_read_leased_or_pinned_key(store):
    put(store, ["leased", "pinned"])
    store.get(["leased"])  # read lease for 5 s (and into t2)
    store.pin(["pinned"], ttl_s=60)
    for i in range(40):
        put(store, [f"f{i}"])
        assert store.exists(["leased", "pinned"]) == [True, True]
    store.check_invariants()


def test_arc_beats_lru_on_a_generated_shared_prefix_trace():
    trace = generate(SynthSpec(requests=600, sessions=40, turns=(1, 10), seed=0))
    lru = simulate(trace, LRUCache(50)).total_hit_tokens
    arc = StoreARC(50)
    result = simulate(trace, arc)
    arc.check_invariants()
    assert result.total_hit_tokens > 1.1 * lru  # 1,285,120 tokens against 1,048,576


class Only:
    """A scope of some keys (as one tier's segments are), its own recency in the given order."""

    def __init__(self, keys):
        self.keys = list(keys)

    def least_recent(self):
        return ((k, _Entry) for k in self.keys)

    def entry(self, key):
        return _Entry if key in self.keys else None


def test_keys_outside_the_scope_are_passed_and_a_long_run_of_them_ends_the_walk():
    arc = ARCEviction()
    outside = [f"ssd{i}" for i in range(SCOPE_SKIPS + 10)]
    for key in ["dram0", *outside, "dram1"]:
        arc.added(key)
    assert arc.victims(Only(["dram0", "dram1"]), lambda key: False, BLOCK) == ["dram0"]
    # dram1 lies past more than SCOPE_SKIPS keys of other tiers: taken from the scope's own order
    assert arc.victims(Only(["dram0", "dram1"]), lambda key: key == "dram0", BLOCK) == ["dram1"]
