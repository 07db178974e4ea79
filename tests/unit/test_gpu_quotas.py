"""Quotas and reserved shares on the GPU tier's moves, as on the others: a GPU -> DRAM demotion
lands within its tenant's DRAM quota (its own oldest DRAM blocks first, or the GPU copy goes), a
DRAM -> GPU promotion only within its tenant's GPU quota, puts go to the GPU only within the GPU
quota, and demotions spare other tenants' reserved GPU bytes. Fake clock; check_invariants
recounts every tenant's usage from the index after each step."""

import pytest

from kvstore.clock import FakeClock
from kvstore.meta.tenants import Tenant, scoped
from kvstore.types import MoveKind, Tier
from tests.meta_helpers import HOST
from tests.unit.test_gpu_tiering import SSD, make, tiers
from tests.unit.test_tiering import BLOCK, put, run_moves


@pytest.fixture
def clock():
    return FakeClock()


def tenant(store, name, **settings):
    t = store.tenants.add(Tenant(name, 0, **settings), update=False)
    return lambda *names: [scoped(t.id, n) for n in names], t.id


def usage(store, tenant_id, tier):
    return store._st.tenants.usage[tenant_id, tier]


def test_demotion_keeps_a_tenant_within_its_dram_quota_its_own_oldest_going_first(clock):
    s = make(clock)
    keys, a = tenant(s, "a", quotas={Tier.DRAM: 2 * BLOCK})
    ks = keys(*(f"k{i}" for i in range(16)))
    put(s, ks)  # the GPU is full of a's blocks
    tasks = run_moves(s)
    assert [t.key for t in tasks] == ks[:2]  # two fit a's DRAM quota ...
    assert tiers(s, ks) == ["dram"] * 2 + [None] * 6 + ["gpu"] * 8  # ... the others' GPU copies went
    assert usage(s, a, Tier.DRAM) == 2 * BLOCK
    put(s, keys(*(f"n{i}" for i in range(8))))  # the GPU past its watermark again
    tasks = run_moves(s)
    assert tasks and all(t.kind is MoveKind.DEMOTE for t in tasks)
    assert usage(s, a, Tier.DRAM) <= 2 * BLOCK and tiers(s, ks[:2]) == [None, None]  # its oldest made room
    assert tiers(s, ks[8:10]) == ["dram", "dram"]
    s.check_invariants()


def test_a_tenant_refused_over_quota_loses_the_gpu_copy_not_its_dram_blocks(clock):
    s = make(clock)
    keys, a = tenant(s, "a", quotas={Tier.DRAM: 2 * BLOCK}, evict_own=False)
    ks = keys(*(f"k{i}" for i in range(16)))
    put(s, ks)
    run_moves(s)
    put(s, keys(*(f"n{i}" for i in range(8))))
    tasks = run_moves(s)
    assert not tasks  # DRAM holds its quota: nothing moves ...
    assert tiers(s, ks[:2]) == ["dram", "dram"]  # ... its DRAM blocks stay
    assert usage(s, a, Tier.DRAM) == 2 * BLOCK and s.stats().evictions > 6
    s.check_invariants()


def test_other_tenants_are_unaffected_by_one_tenants_dram_quota(clock):
    s = make(clock)
    a_keys, _ = tenant(s, "a", quotas={Tier.DRAM: BLOCK})
    b_keys, b = tenant(s, "b")
    ks = [k for i in range(8) for k in (a_keys(f"k{i}") + b_keys(f"k{i}"))]  # interleaved, a's first
    put(s, ks)
    run_moves(s)
    demoted_b = [k for k, t in zip(ks[1::2], tiers(s, ks[1::2])) if t == "dram"]
    assert demoted_b and usage(s, b, Tier.DRAM) == len(demoted_b) * BLOCK
    assert None not in tiers(s, ks[1::2])  # b lost nothing
    s.check_invariants()


def test_puts_go_to_the_gpu_only_within_the_gpu_quota(clock):
    s = make(clock)
    keys, a = tenant(s, "a", quotas={Tier.GPU: 3 * BLOCK})
    ks = keys(*(f"k{i}" for i in range(5)))
    for k in ks:
        put(s, [k])
    assert tiers(s, ks) == ["gpu"] * 3 + ["dram"] * 2
    assert usage(s, a, Tier.GPU) == 3 * BLOCK


def test_promotion_to_the_gpu_respects_the_gpu_quota(clock):
    s = make(clock)
    a_keys, a = tenant(s, "a", quotas={Tier.GPU: BLOCK})
    b_keys, _ = tenant(s, "b")
    bs = b_keys(*(f"k{i}" for i in range(12)))
    a0, a1 = a_keys("k0", "k1")
    put(s, bs)
    put(s, [a0])  # a's GPU quota is full ...
    put(s, [a1])  # ... so this one lands in DRAM
    run_moves(s)  # b's five oldest go down to DRAM
    assert tiers(s, [a0, a1, bs[0]]) == ["gpu", "dram", "dram"]
    for key in (a1, bs[0]):  # both hot
        s.get([key], client_host=HOST)
        s.get([key], client_host=HOST)
    clock.advance(6)  # the reads' leases are over
    tasks = run_moves(s)
    assert [(t.kind, t.key) for t in tasks] == [(MoveKind.PROMOTE, bs[0])]  # a1 stays: a's GPU quota
    assert tiers(s, [a1, bs[0]]) == ["dram", "gpu"] and usage(s, a, Tier.GPU) == BLOCK
    s.check_invariants()


def test_demotions_spare_another_tenants_reserved_gpu_bytes(clock):
    s = make(clock)
    r_keys, r = tenant(s, "r", reserved={Tier.GPU: 4 * BLOCK})
    s_keys, _ = tenant(s, "storm")
    mine = r_keys(*(f"k{i}" for i in range(4)))
    put(s, mine)  # r's blocks are the oldest on the GPU
    put(s, s_keys(*(f"k{i}" for i in range(12))))
    tasks = run_moves(s)
    assert tasks and not {t.key for t in tasks} & set(mine)
    assert tiers(s, mine) == ["gpu"] * 4 and usage(s, r, Tier.GPU) == 4 * BLOCK
    s.check_invariants()


def test_one_claims_demotions_to_ssd_stay_within_the_ssd_quota_too(clock):
    s = make(clock, gpu=0, ssd=SSD)
    keys, a = tenant(s, "a", quotas={Tier.SSD: 2 * BLOCK})
    ks = keys(*(f"k{i}" for i in range(26)))  # DRAM past its watermark
    put(s, ks)
    tasks = run_moves(s)  # moves on their way count as landed
    assert [t.key for t in tasks] == ks[:2] and usage(s, a, Tier.SSD) == 2 * BLOCK
    s.check_invariants()
