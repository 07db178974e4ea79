"""A token grants only what the tenant registry of the store answering now says, on every call
of a connection already open: against real Redis and real `kvstore meta` / `kvstore serve`
processes, a made-up token of a tenant token's shape that a standby (which holds no registry)
let through HELLO gains nothing once that node leads or rebuilds its store, and a tenant demoted
(its admin flag, its shm trust, its token) loses the rights on connections it already has."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kvstore.errors import ErrorCode, NotLeader, PermissionDenied, Unauthenticated, Unavailable
from kvstore.meta.tenants import Tenant, TenantRegistry
from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.server.auth import Authenticator
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc
from kvstore.wire import frames
from kvstore.wire.calls import Exists, ServiceInfo, Stats, TenantAdd, TenantRevoke, TenantToken
from tests.cluster import Cluster, Proc, authed_channel, wait_until
from tests.redis_server import RedisServer

# Short leases, so a takeover takes seconds (as tests/ha/conftest.py's FAST).
FAST = {
    "KVSTORE_META_LEADER_TTL_S": "2",
    "KVSTORE_META_LEADER_RENEW_S": "0.3",
    "KVSTORE_META_LEASE_TTL_S": "2",
    "KVSTORE_META_WRITE_GRANT_TTL_S": "2",
    "KVSTORE_META_PUT_LEASE_TTL_S": "4",
    "KVSTORE_META_HEARTBEAT_TTL_S": "6",
}
MADE_UP = "kvst_0badc0de_" + "M" * 43  # the shape of a tenant token; no registry holds it
REFUSED_AS_STANDBY = (ErrorCode.NOT_LEADER, ErrorCode.UNAVAILABLE)
DATA_CALLS: dict[str, Any] = {
    "PutStart": pb.PutStartRequest(keys=["stolen/1"], sizes=[4096]),
    "Get": pb.GetRequest(keys=["stolen/1"]),
    "ListKeys": pb.ListKeysRequest(),
    "Remove": pb.RemoveRequest(keys=["stolen/1"]),
}


class Lane:
    """One raw fast-lane connection, as a client's pool holds it: HELLO once, then calls."""

    def __init__(self, address: str, token: str) -> None:
        with MetaClient(address, fast_lane=False) as meta:
            port = meta.call(ServiceInfo()).fast_lane_port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(frames.hello_frame("tests", token))
        status, body = self._read()
        assert status == frames.OK, pb.ErrorDetail.FromString(body)

    def _read(self) -> tuple[int, bytes]:
        try:
            (_, status), body = frames.recv_frame(self.sock, frames.RESPONSE)
        except (EOFError, OSError):
            return -1, b""  # the service closed the connection
        return status, body

    def call(self, name: str, request: Any) -> tuple[int, bytes]:
        """(status, payload): frames.OK and the response, an ErrorCode and its ErrorDetail, or -1
        if the connection is closed."""
        _, header, payload = frames.encode_request(name, request)
        try:
            frames.send_frame(self.sock, header, payload)
        except OSError:
            return -1, b""
        return self._read()

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except (TimeoutError, BlockingIOError):
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def role(address: str) -> str:
    with MetaClient(address, fast_lane=False) as meta:
        return meta.call(ServiceInfo()).role


def writes_open(address: str) -> bool:
    with MetaClient(address, fast_lane=False) as meta:
        stats = meta.call(Stats())
    return stats.role == "leader" and stats.writes_open


def answered(lane: Lane, name: str, request: Any) -> int:
    """The first answer to `name` on `lane` that is not a standby's (NOT_LEADER, UNAVAILABLE)."""
    statuses: list[int] = []

    def leads() -> bool:
        statuses.append(lane.call(name, request)[0])
        return statuses[-1] not in REFUSED_AS_STANDBY

    wait_until(leads, what=f"{name} answered as a leader answers")
    return statuses[-1]


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    # The tests kill -9 Redis right after a tenant's token is written: with appendfsync everysec a
    # busy disk lets Redis postpone its AOF write up to 2 s, and the token is lost with the kill.
    server = RedisServer(tmp_path / "redis", appendfsync="always").start()
    yield server
    server.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    c.close()


def meta_on(cluster: Cluster, redis: RedisServer) -> tuple[Proc, str]:
    return cluster.meta({**FAST, "KVSTORE_META_REDIS_URL": redis.url})


def test_a_made_up_token_let_in_by_a_standby_gains_nothing_once_the_standby_leads(cluster, redis):
    old, old_address = meta_on(cluster, redis)
    wait_until(lambda: writes_open(old_address), what="the first service to lead, writes open")
    _, standby = meta_on(cluster, redis)
    assert role(standby) == "standby"
    with MetaClient(old_address) as admin:
        admin.call(TenantAdd(TenantInfo("real")))
        _, real_token = admin.call(TenantToken("real"))

    real = Lane(standby, real_token)  # the standby cannot check either: both get in
    forged = {name: Lane(standby, MADE_UP) for name in DATA_CALLS}
    for name, request in DATA_CALLS.items():
        assert forged[name].call(name, request)[0] == ErrorCode.NOT_LEADER  # and the lane stays open
    assert forged["ListKeys"].call("ServiceInfo", pb.ServiceInfoRequest())[0] == frames.OK

    old.kill()  # the standby takes the lease and loads the records, tenants included
    assert answered(real, "ListKeys", pb.ListKeysRequest()) == frames.OK  # re-verified: a real tenant
    wait_until(lambda: writes_open(standby), what="the new leader to open for writes")
    for name, request in DATA_CALLS.items():
        status, body = forged[name].call(name, request)
        assert status == ErrorCode.UNAUTHENTICATED, (name, status, body)
        assert forged[name].closed(), name
    assert real.call("Exists", pb.ExistsRequest(keys=["k"]))[0] == frames.OK


def test_a_made_up_token_let_in_while_redis_was_away_gains_nothing_once_the_store_is_rebuilt(cluster, redis):
    _, address = meta_on(cluster, redis)
    wait_until(lambda: writes_open(address), what="the service to lead, writes open")
    with MetaClient(address) as admin:
        admin.call(TenantAdd(TenantInfo("real")))
        _, real_token = admin.call(TenantToken("real"))
    real = Lane(address, real_token)
    assert real.call("ListKeys", pb.ListKeysRequest())[0] == frames.OK

    redis.kill()  # the lease runs out unrenewed: the service drops its store and stands by
    wait_until(lambda: role(address) != "leader", what="the service to step down without Redis")
    forged = Lane(address, MADE_UP)
    assert forged.call("ListKeys", pb.ListKeysRequest())[0] in REFUSED_AS_STANDBY
    assert real.call("ListKeys", pb.ListKeysRequest())[0] in REFUSED_AS_STANDBY

    redis.start()  # it leads again, with a store built afresh from the records
    assert answered(real, "ListKeys", pb.ListKeysRequest()) == frames.OK
    assert forged.call("ListKeys", pb.ListKeysRequest())[0] == ErrorCode.UNAUTHENTICATED
    assert forged.closed()


def test_without_a_registry_a_tenant_token_carries_no_data_rights():
    """The window a takeover or a rebuild leaves (no registry yet): a tenant-shaped token is let
    through for ServiceInfo and Stats only; a data call gets what a standby says, never an answer."""
    here: list[TenantRegistry | None] = [None]
    auth = Authenticator(True, "kvsa_operator", "kvsd_daemon", lambda: here[0])
    who = auth.principal(MADE_UP)
    who.check("ServiceInfo")
    for method in ("PutStart", "Get", "ListKeys", "Remove", "Exists", "TenantList"):
        with pytest.raises((NotLeader, Unavailable)):
            who.check(method)
    registry = TenantRegistry()
    registry.add(Tenant("real", 0), update=False)
    _, token = registry.make_token("real", 0.0)
    here[0] = registry
    with pytest.raises(Unauthenticated):
        auth.principal(MADE_UP)  # verified now: unknown
    auth.principal(token).check("Get")


def test_a_session_is_checked_again_only_when_the_registry_changes():
    """A fast-lane connection's caller: the same answer while the registry's generation stands;
    checked again across a rebuild (no registry, then another one) and a tenant's change."""
    first = TenantRegistry()
    first.add(Tenant("real", 0, admin=True), update=False)
    _, token = first.make_token("real", 0.0)
    rebuilt = TenantRegistry()
    rebuilt.load({t.name: t.encode() for t in first.all()})
    here: list[TenantRegistry | None] = [first]
    auth = Authenticator(True, "kvsa_operator", "kvsd_daemon", lambda: here[0])
    session = auth.session(token)
    who = auth.current(session)
    assert who.admin and auth.current(session) is who  # nothing changed: nothing checked again

    here[0] = None  # the store is being rebuilt
    with pytest.raises(Unavailable):
        auth.current(session).check("Get")
    forged = auth.session(MADE_UP)
    here[0] = rebuilt
    assert auth.current(session).name == "real"
    with pytest.raises(Unauthenticated):
        auth.current(forged)

    rebuilt.add(Tenant("real", 0, admin=False), update=True)
    assert not auth.current(session).admin
    with pytest.raises(PermissionDenied):
        auth.current(session).check("TenantList")


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    c = Cluster()
    _, address = c.serve("64MiB", "--segment-size", "32MiB")
    yield address
    c.close()


def _offers_shm(response: pb.PutStartResponse) -> bool:
    return any(e.transport == "shm" for seg in response.segments for e in seg.endpoints)


@pytest.mark.parametrize("lane", ["fast-lane", "grpc"])
def test_a_demoted_tenant_loses_its_rights_on_connections_already_open(served, lane):
    name = f"boss-{lane}"
    with MetaClient(served) as admin:
        admin.call(TenantAdd(TenantInfo(name, trust_shm=True, admin=True)))
        token_id, token = admin.call(TenantToken(name))
        if lane == "fast-lane":
            conn = Lane(served, token)

            def call(method: str, request: Any) -> tuple[int, Any]:
                status, body = conn.call(method, request)
                reply = frames.METHODS[frames.METHOD_IDS[method]].response
                return status, (reply.FromString(body) if status == frames.OK else body)
        else:
            stub = pb_grpc.MetaServiceStub(authed_channel(served, token))  # one channel, kept open

            def call(method: str, request: Any) -> tuple[int, Any]:
                try:
                    return frames.OK, getattr(stub, method)(request, timeout=10)
                except grpc.RpcError as exc:
                    return int(ErrorCode[exc.code().name]), exc.details()

        def put_start(key: str) -> pb.PutStartResponse:
            status, reply = call("PutStart", pb.PutStartRequest(keys=[key], sizes=[4096], client_host="here"))
            assert status == frames.OK, reply
            return reply

        assert call("TenantList", pb.TenantListRequest())[0] == frames.OK  # an admin tenant
        assert _offers_shm(put_start("trusted"))

        admin.call(TenantAdd(TenantInfo(name, trust_shm=False, admin=False), update=True))
        assert call("TenantList", pb.TenantListRequest())[0] == ErrorCode.PERMISSION_DENIED
        assert not _offers_shm(put_start("untrusted"))

        _, rotated = admin.call(TenantToken(name))  # rotation: a new token, the old one revoked
        admin.call(TenantRevoke(name, token_id))
        assert call("Exists", pb.ExistsRequest(keys=["trusted"]))[0] == ErrorCode.UNAUTHENTICATED
        if lane == "fast-lane":
            assert conn.closed()
        with MetaClient(served, token=rotated) as fresh:
            assert fresh.call(Exists(["trusted"])) == [False]  # the tenant goes on with its new token
