"""Tenants in the metadata service, driven through MetaHandlers (the layer both lanes call) over a
MetaStore with a fake clock: namespaces, roles, tokens, quotas and reserved shares, and the
accounting behind them (check_invariants recounts it from the index after every test)."""

import pytest

from kvstore import tokens
from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import (
    AlreadyExists,
    ErrorCode,
    InvalidArgument,
    KeyNotFound,
    PermissionDenied,
    Unauthenticated,
)
from kvstore.meta.store import MetaStore
from kvstore.meta.tenants import Tenant, TenantRegistry, namespace, scoped, tenant_of
from kvstore.results import TenantInfo
from kvstore.server.auth import OPERATOR, Authenticator, Principal
from kvstore.server.handlers import MetaHandlers
from kvstore.types import Tier
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import convert
from tests.meta_helpers import HOST, SIGNER, receipts, segment

KIB = 1024


@pytest.fixture
def store():
    s = MetaStore(MetaConfig(high_watermark=0.95, low_watermark=0.5), SIGNER, FakeClock())
    s.mount_segment(segment("s1", "d1", Tier.DRAM, 64 * KIB))
    yield s
    s.check_invariants()


@pytest.fixture
def h(store):
    return MetaHandlers(store)


def call(h, method, who, **fields):
    request = getattr(pb, f"{method}Request")(**fields)
    return h.handler(method)(request, who)


def add(h, name, **settings):
    info = TenantInfo(name, **settings)
    return h.handler("TenantAdd")(pb.TenantAddRequest(tenant=_pb(info)), OPERATOR).tenant


def _pb(info):
    from kvstore.wire.tenant_info import tenant_to_pb

    return tenant_to_pb(info)


def principal(h, name):
    t = h.stores.current().tenants.get(name)
    return Principal(t.id, t.name, admin=t.admin, trust_shm=t.trust_shm)


def put(h, who, keys, size=KIB, host=""):
    started = call(h, "PutStart", who, keys=keys, sizes=[size] * len(keys), replica_num=1, client_host=host)
    reply = convert.put_start_reply_from_pb(started)
    ok = [(k, r) for k, r in zip(keys, reply.results) if r.code is ErrorCode.OK]
    if ok:
        written = [convert.put_written_to_pb(receipts(r)) for _, r in ok]
        call(h, "PutEnd", who, keys=[k for k, _ in ok], checksums=[7] * len(ok), written=written)
    return [r.code for r in reply.results], started


def test_the_same_key_of_two_tenants_is_two_objects_and_neither_sees_the_other(h):
    add(h, "a")
    add(h, "b")
    a, b = principal(h, "a"), principal(h, "b")
    assert put(h, a, ["k"])[0] == [ErrorCode.OK]
    assert call(h, "Exists", b, keys=["k"]).exists == [False]
    assert call(h, "MatchPrefix", b, keys=["k"]).count == 0
    assert convert.get_reply_from_pb(call(h, "Get", b, keys=["k"])).results[0].code is ErrorCode.KEY_NOT_FOUND
    assert put(h, b, ["k"])[0] == [ErrorCode.OK]  # no cross-tenant "already exists"
    assert call(h, "Exists", OPERATOR, keys=["k"]).exists == [False]  # the default tenant is a tenant too
    removed = call(h, "Remove", b, keys=["k"])
    assert removed.results[0].code == pb.OK
    assert call(h, "Exists", a, keys=["k"]).exists == [True]


def test_answers_name_a_tenants_own_keys_only(h):
    add(h, "a")
    a = principal(h, "a")
    put(h, a, ["mine/1", "mine/2"])
    listing = call(h, "ListKeys", a, prefix="mine/", limit=1)
    assert list(listing.keys) == ["mine/1"] and listing.next_cursor == "mine/1"
    assert list(call(h, "ListKeys", a, prefix="", cursor="mine/1").keys) == ["mine/2"]
    assert list(call(h, "ListKeys", OPERATOR).keys) == []  # the default tenant lists none of a's
    missing = convert.get_reply_from_pb(call(h, "Get", a, keys=["nope"])).results[0].message
    assert "'nope'" in missing and "\\x00" not in missing
    described = call(h, "Describe", a, keys=["nope"]).keys[0].status.message
    assert "'nope'" in described and "\\x00" not in described


@pytest.mark.parametrize("key", ["\0", "a\0b", "\x001\x00k", "x" * 1025, ""])
def test_keys_that_could_name_another_namespace_are_refused(h, key):
    add(h, "a")
    with pytest.raises(InvalidArgument):
        call(h, "Exists", principal(h, "a"), keys=[key])
    with pytest.raises(InvalidArgument):
        call(h, "Exists", OPERATOR, keys=[key])


def test_roles(h):
    add(h, "a")
    a = principal(h, "a")
    daemon = Principal(0, "daemon", daemon=True)
    for name, who in (("TenantList", a), ("MountSegment", a), ("Heartbeat", a), ("Exists", daemon)):
        with pytest.raises(PermissionDenied):
            call(h, name, who)
    call(h, "Heartbeat", daemon, daemon_id="d1")
    call(h, "TenantList", OPERATOR)
    stats = call(h, "Stats", a)
    assert stats.tenant == "a" and stats.keys == 0 and not stats.daemons


def test_tokens_authenticate_until_revoked_and_are_kept_hashed(h, store):
    add(h, "a")
    auth = Authenticator(True, "kvsa_operator", SIGNER.daemon_token, lambda: store.tenants)
    made = call(h, "TenantToken", OPERATOR, name="a")
    assert auth.principal(made.token).name == "a"
    assert made.token not in store.tenants.get("a").encode().decode()  # only its digest is kept
    assert auth.principal("kvsa_operator") is OPERATOR
    assert auth.principal(SIGNER.daemon_token).daemon
    for bad in ("", "kvsa_operatoR", made.token[:-1], made.token + "x", "kvst_00000000_" + "x" * 43, "x" * 10000):
        with pytest.raises(Unauthenticated):
            auth.principal(bad)
    session = auth.session(made.token)
    assert auth.current(session).name == "a"
    assert call(h, "TenantRevoke", OPERATOR, name="a").revoked == 1
    with pytest.raises(Unauthenticated):
        auth.current(session)
    with pytest.raises(Unauthenticated):
        auth.principal(made.token)


def test_tenant_names_and_updates(h):
    add(h, "team-a.1")
    with pytest.raises(AlreadyExists):
        add(h, "team-a.1")
    for bad in ("", "Team", "а", "x" * 64, "-x", "a/b"):  # "а" is Cyrillic
        with pytest.raises(InvalidArgument):
            add(h, bad)
    with pytest.raises(KeyNotFound):
        call(h, "TenantToken", OPERATOR, name="nobody")


def test_a_put_over_quota_evicts_the_tenants_own_oldest_blocks_first(h, store):
    add(h, "a", quotas={Tier.DRAM: 4 * KIB})
    add(h, "b")
    a, b = principal(h, "a"), principal(h, "b")
    put(h, b, ["b/0"])
    put(h, a, [f"a/{i}" for i in range(4)])
    assert put(h, a, ["a/4"])[0] == [ErrorCode.OK]
    assert call(h, "Exists", a, keys=[f"a/{i}" for i in range(5)]).exists == [False, True, True, True, True]
    assert call(h, "Exists", b, keys=["b/0"]).exists == [True]
    assert store.tenants.usage[a.tenant, Tier.DRAM] == 4 * KIB


def test_a_tenant_refused_over_quota_gets_quota_exceeded(h):
    add(h, "a", quotas={Tier.DRAM: 2 * KIB}, evict_own=False)
    a = principal(h, "a")
    assert put(h, a, ["a/0", "a/1"])[0] == [ErrorCode.OK] * 2
    codes, started = put(h, a, ["a/2"])
    assert codes == [ErrorCode.QUOTA_EXCEEDED] and "quota" in started.results[0].status.message


def test_a_put_storm_leaves_another_tenant_its_reserved_share(h, store):
    add(h, "a", reserved={Tier.DRAM: 8 * KIB})
    add(h, "storm")
    a, storm = principal(h, "a"), principal(h, "storm")
    put(h, a, [f"a/{i}" for i in range(10)])
    codes = [put(h, storm, [f"s/{i}"])[0][0] for i in range(200)]
    assert codes == [ErrorCode.OK] * 200  # the storm evicts a's unreserved blocks, then its own
    assert store.tenants.usage[a.tenant, Tier.DRAM] >= 8 * KIB
    assert call(h, "Exists", a, keys=[f"a/{i}" for i in range(2, 10)]).exists == [True] * 8


def test_a_tenant_not_trusted_with_shm_gets_no_shm_endpoint_and_no_local_grant(h):
    add(h, "a")
    add(h, "t", trust_shm=True)
    _, plain = put(h, principal(h, "a"), ["k"], host=HOST)
    assert all(e.transport != "shm" for s in plain.segments for e in s.endpoints)
    assert all(not g.flags for r in plain.results for g in r.replicas)
    _, trusted = put(h, principal(h, "t"), ["k"], host=HOST)
    assert any(e.transport == "shm" for s in trusted.segments for e in s.endpoints)
    assert all(g.flags for r in trusted.results for g in r.replicas)


def test_tenants_survive_in_the_journal_records():
    reg = TenantRegistry()
    reg.add(Tenant("a", 0, {Tier.DRAM: 5}, {Tier.SSD: 3}, False, True, False), update=False)
    token_id, token = reg.make_token("a", 12.5)
    again = TenantRegistry()
    again.load({k: v for k, v in reg.take_changes().items() if v is not None})
    t = again.get("a")
    assert (t.id, t.quotas, t.reserved, t.evict_own, t.trust_shm) == (1, {Tier.DRAM: 5}, {Tier.SSD: 3}, False, True)
    assert again.lookup(token, 13.0) is t and t.tokens[token_id].digest == tokens.digest(token)
    with pytest.raises(InvalidArgument):
        again.load({"b": b"not json"})


def test_namespaces():
    assert scoped(0, "k") == "k" and namespace(0) == ""
    assert scoped(12, "k") == "\x0012\x00k" and tenant_of(scoped(12, "k")) == 12 and tenant_of("k") == 0


def test_a_token_with_a_ttl_stops_working_when_it_runs_out():
    clock = FakeClock()
    store = MetaStore(MetaConfig(), SIGNER, clock)
    h = MetaHandlers(store)
    add(h, "a")
    auth = Authenticator(True, "", SIGNER.daemon_token, lambda: store.tenants, clock)
    made = call(h, "TenantToken", OPERATOR, name="a", ttl_ms=60_000)
    session = auth.session(made.token)
    clock.advance(59)
    assert auth.current(session).name == "a" and auth.principal(made.token).name == "a"
    clock.advance(2)
    with pytest.raises(Unauthenticated):
        auth.current(session)
    with pytest.raises(Unauthenticated):
        auth.principal(made.token)
