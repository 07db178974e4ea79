"""Regions (one-call puts of small values, kvstore/meta/regions.py) on a MetaStore driven by a fake
clock, with check_invariants() after every step: pieces never overlap or leave their region,
what is not committed goes back on release or expiry, and only the writer commits."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.grant import LOCAL
from kvstore.meta.state import GRACE_S
from kvstore.meta.store import MetaStore
from kvstore.meta.tenants import scoped
from kvstore.results import TenantInfo
from kvstore.server.auth import OPERATOR, Principal
from kvstore.server.handlers import MetaHandlers
from kvstore.types import GrantMode, Tier
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import convert
from tests.meta_helpers import HOST, SIGNER, segment

SEG = 1 << 20


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    s = MetaStore(
        MetaConfig(
            write_grant_ttl_s=10, put_lease_ttl_s=30, heartbeat_ttl_s=1000, high_watermark=1.0, low_watermark=0.9
        ),
        SIGNER,
        clock,
    )
    s.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    yield s
    s.check_invariants()


def commit(store, *args, **kwargs):
    return store.regions.put_commit(*args, **kwargs)


def used(store):
    return store.stats().used


def test_a_region_is_a_local_write_grant_on_the_writers_host(store):
    r = store.regions.reserve("w1", HOST, 64 << 10)
    assert r.code is ErrorCode.OK and r.segment.segment_id == "s1" and r.alignment == 64
    assert r.grant.mode is GrantMode.WRITE and r.grant.flags & LOCAL and r.grant.length == 64 << 10
    assert used(store) == 64 << 10  # reserved space counts as used
    assert store.regions.reserve("w1", "another-host", 4096).code is ErrorCode.UNAVAILABLE
    with pytest.raises(InvalidArgument):
        commit(store, "w1", r.region_id, ["a"], [r.grant.offset], [10], [1, 2])
    store.check_invariants()


def test_committed_pieces_are_stored_keys_and_never_overlap(store):
    r = store.regions.reserve("w1", HOST, 8192)
    base = r.grant.offset
    assert [x.code for x in commit(store, "w1", r.region_id, ["a", "b"], [base, base + 128], [100, 50], [7, 8])] == [
        ErrorCode.OK,
        ErrorCode.OK,
    ]
    store.check_invariants()
    [g] = store.get(["a"]).results
    assert (g.size, g.checksum, g.grants[0].offset) == (100, 7, base)
    refused = commit(
        store,
        "w1",
        r.region_id,
        ["c", "d", "e", "f"],
        [base + 64, base + 8192, base + 130, base + 128],
        [64, 10, 10, 10],
        [1, 1, 1, 1],
    )
    assert [x.code for x in refused] == [ErrorCode.INVALID_ARGUMENT] * 4  # overlaps a, outside, unaligned, b's
    twice = commit(store, "w1", r.region_id, ["g", "h"], [base + 256, base + 256], [10, 10], [1, 1])
    assert [x.code for x in twice] == [ErrorCode.OK, ErrorCode.INVALID_ARGUMENT]  # one batch, one piece each
    assert store.exists(["c", "d", "e", "f", "h"]) == [False] * 5
    assert commit(store, "w1", r.region_id, ["a"], [base + 320], [10], [1])[0].code is ErrorCode.ALREADY_EXISTS
    # The same commit again (its answer was lost): the key is stored, and stays as it was.
    assert commit(store, "w1", r.region_id, ["a"], [base], [100], [7])[0].code is ErrorCode.ALREADY_EXISTS
    [g] = store.get(["a"]).results
    assert (g.size, g.checksum, g.grants[0].offset) == (100, 7, base)
    store.check_invariants()


def test_only_the_writer_commits_into_its_region(store):
    r = store.regions.reserve("w1", HOST, 4096)
    other = commit(store, "w2", r.region_id, ["x"], [r.grant.offset], [10], [1])
    assert other[0].code is ErrorCode.KEY_NOT_FOUND and store.exists(["x"]) == [False]
    assert commit(store, "w1", 12345, ["x"], [r.grant.offset], [10], [1])[0].code is ErrorCode.KEY_NOT_FOUND


def test_release_frees_what_was_not_committed(store):
    r = store.regions.reserve("w1", HOST, 64 << 10)
    commit(store, "w1", r.region_id, ["a"], [r.grant.offset + 4096], [1000], [1])
    assert used(store) == 64 << 10
    commit(store, "w1", r.region_id, [], [], [], [], released=[r.region_id])
    assert used(store) == 1024  # a's piece, aligned
    store.check_invariants()
    store.remove(["a"])
    assert used(store) == 0
    assert commit(store, "w1", r.region_id, ["b"], [r.grant.offset], [10], [1])[0].code is ErrorCode.KEY_NOT_FOUND


def test_an_abandoned_region_goes_back_once_its_grant_and_the_grace_are_over(store, clock):
    r = store.regions.reserve("w1", HOST, 64 << 10)
    commit(store, "w1", r.region_id, ["a"], [r.grant.offset], [100], [1])
    clock.advance(10 + GRACE_S / 2)
    store.tick()
    assert used(store) == 64 << 10  # a late commit is still taken ...
    assert commit(store, "w1", r.region_id, ["b"], [r.grant.offset + 128], [100], [1])[0].code is ErrorCode.OK
    clock.advance(GRACE_S)
    store.tick()  # ... and then the region is gone
    assert used(store) == 256 and store.exists(["a", "b"]) == [True, True]
    store.check_invariants()


def test_regions_leave_room_for_puts_and_fail_over_to_them(store):
    regions = [store.regions.reserve("w1", HOST, 256 << 10) for _ in range(4)]
    assert all(r.code is ErrorCode.OK for r in regions)
    assert store.regions.reserve("w1", HOST, 4096).code is ErrorCode.NO_SPACE  # nothing is evicted for a region
    commit(store, "w1", 0, [], [], [], [], released=[r.region_id for r in regions])
    assert used(store) == 0 and store.put_start(["p"], [SEG]).results[0].code is ErrorCode.OK


def test_no_regions_where_puts_land_on_the_gpu_tier(store):
    store.mount_segment(segment("g1", "d1", Tier.GPU, SEG))
    assert store.regions.reserve("w1", HOST, 4096).code is ErrorCode.UNAVAILABLE


def test_an_unmounted_segment_takes_its_regions_with_it(store):
    r = store.regions.reserve("w1", HOST, 4096)
    store.unmount_segment("s1")
    store.check_invariants()
    assert commit(store, "w1", r.region_id, ["a"], [r.grant.offset], [10], [1])[0].code is ErrorCode.KEY_NOT_FOUND
    assert store.exists(["a"]) == [False]


# -- tenants: through MetaHandlers, the layer both lanes call --------------------------------------


def _tenant(h, name, **settings):
    from kvstore.wire.tenant_info import tenant_to_pb

    h.handler("TenantAdd")(pb.TenantAddRequest(tenant=tenant_to_pb(TenantInfo(name, **settings))), OPERATOR)
    t = h.stores.current().tenants.get(name)
    return Principal(t.id, t.name, admin=t.admin, trust_shm=t.trust_shm)


def _reserve(h, who, client_id="w1", size=64 << 10):
    request = pb.ReserveRequest(client_id=client_id, client_host=HOST, bytes=size)
    return convert.reserved_from_pb(h.handler("Reserve")(request, who))


def _commit(h, who, region, keys, client_id="w1"):
    base = region.grant.offset
    request = pb.PutCommitRequest(client_id=client_id, region_id=region.region_id, keys=keys,
                                  offsets=[base + 64 * i for i in range(len(keys))], sizes=[10] * len(keys),
                                  checksums=[1] * len(keys))  # fmt: skip
    return [r.code for r in h.handler("PutCommit")(request, who).results]


def test_a_tenants_region_commits_its_keys_in_its_namespace(store):
    h = MetaHandlers(store)
    a, b = _tenant(h, "a", trust_shm=True), _tenant(h, "b", trust_shm=True)
    region = _reserve(h, a)
    assert region.code is ErrorCode.OK and region.grant.flags & LOCAL
    assert _commit(h, a, region, ["k"]) == [pb.OK]
    exists = h.handler("Exists")
    assert exists(pb.ExistsRequest(keys=["k"]), a).exists == [True]
    assert exists(pb.ExistsRequest(keys=["k"]), b).exists == [False]
    assert exists(pb.ExistsRequest(keys=["k"]), OPERATOR).exists == [False]
    assert store.exists([scoped(a.tenant, "k")]) == [True]
    # the same client id in another tenant is another writer: it cannot commit into a's region
    assert _commit(h, b, region, ["j"]) == [pb.KEY_NOT_FOUND]
    assert exists(pb.ExistsRequest(keys=["j"]), b).exists == [False]


def test_no_region_for_a_tenant_not_trusted_with_shm_or_held_to_a_dram_quota(store):
    h = MetaHandlers(store)
    confined = _tenant(h, "confined", trust_shm=False)
    assert _reserve(h, confined).code is ErrorCode.UNAVAILABLE  # no LOCAL grant, ever
    capped = _tenant(h, "capped", trust_shm=True, quotas={Tier.DRAM: 1 << 20})
    assert _reserve(h, capped).code is ErrorCode.UNAVAILABLE  # its puts take PutStart, which keeps the quota
    assert used(store) == 0
