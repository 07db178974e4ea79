"""Bad input gets a typed error, the servers keep serving, and committed blocks are unchanged."""

import socket
import struct

import grpc
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, KeyBusy, KeyNotFound, NoSpace, PermissionDenied, TransportError
from kvstore.types import Grant, GrantMode
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc
from kvstore.wire import convert
from kvstore.wire.calls import Get
from tests.cluster import authed_channel

COMMITTED = {f"keep/{i}": bytes([i]) * (1000 + i) for i in range(20)}


@pytest.fixture(scope="module")
def served():
    from tests.cluster import Cluster

    c = Cluster()
    _, address = c.serve("64MiB", "--segment-size", "32MiB")
    with KVClient(address) as client:
        client.put_many(list(COMMITTED), list(COMMITTED.values()))
    yield address
    c.close()


@pytest.fixture
def client(served):
    with KVClient(served, ClientConfig(timeout_s=5)) as c:
        yield c
    # after every bad input: still serving, nothing committed changed
    with KVClient(served, ClientConfig(transports=("tcp",))) as c:
        assert c.get_many(list(COMMITTED)) == list(COMMITTED.values())


def raw_stub(address):
    return pb_grpc.MetaServiceStub(authed_channel(address))


@pytest.mark.parametrize("key", ["", "k" * 1025])
def test_bad_keys(client, served, key):
    with pytest.raises(InvalidArgument):
        client.put(key, b"v")
    with pytest.raises(InvalidArgument):
        client.get(key)
    with pytest.raises(grpc.RpcError) as info:  # the server checks too
        raw_stub(served).Get(pb.GetRequest(keys=[key]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_malformed_requests(served, client):
    stub = raw_stub(served)
    for request in (pb.PutStartRequest(keys=["a", "b"], sizes=[1]), pb.PutStartRequest(keys=["a"], sizes=[0])):
        with pytest.raises(grpc.RpcError) as info:
            stub.PutStart(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        stub.MountSegment(pb.MountSegmentRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_value_larger_than_any_segment(client):
    with pytest.raises(InvalidArgument, match="larger than any segment"):
        client.put("too-big", bytes(33 << 20))


def test_unknown_key(client):
    with pytest.raises(KeyNotFound, match="recompute"):
        client.get("never-written")
    assert client.exists("never-written") is False


def test_get_of_a_put_that_has_not_ended(client, served):
    raw_stub(served).PutStart(pb.PutStartRequest(keys=["half-written"], sizes=[100]))
    with pytest.raises(KeyBusy):
        client.get("half-written")
    assert client.match_prefix(["half-written"]) == 0
    raw_stub(served).PutRevoke(pb.PutRevokeRequest(keys=["half-written"]))


def test_buffer_too_small_and_wrong_types(client):
    with pytest.raises(InvalidArgument, match="holds 10 bytes"):
        client.get_into("keep/5", bytearray(10))
    with pytest.raises(InvalidArgument, match="read-only"):
        client.get_into("keep/5", b"x" * 2000)
    with pytest.raises(InvalidArgument):
        client.put("obj", object())


def test_full_store_with_everything_leased_is_no_space(client):
    keys = [f"fill/{i}" for i in range(100)]
    written = []

    def lease(keys):  # a Get whose reader is still copying: leased
        client.meta.call(Get(keys))

    lease(list(COMMITTED))  # a full store would evict them otherwise
    with pytest.raises(NoSpace):
        for k in keys:
            client.put(k, bytes(1 << 20))
            lease([k])  # cannot be evicted
            written.append(k)
    assert written
    client.remove_many(written, force=True)


def _tcp_address(client):
    seg = client.stats().daemons[0].segments[0]
    host, port = seg.endpoint("tcp").address.rsplit(":", 1)
    return seg, (host, int(port))


@pytest.mark.parametrize(
    "junk",
    [
        b"",
        b"\x00" * 3,
        b"GET / HTTP/1.1\r\n\r\n",
        b"KVTP" + b"\xff" * 60,
        b"KVTP\x01\x02" + struct.pack("<HI", 5, 1 << 30),
    ],
)
def test_garbage_on_the_daemon_port(client, junk):
    _, addr = _tcp_address(client)
    with socket.create_connection(addr, timeout=5) as s:
        try:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):  # an error reply and/or a close; never a hang
                pass
        except OSError:  # reset, or closed with our junk unread: also a refusal
            pass
    # the client fixture's teardown then checks the daemon still serves and nothing changed


def test_forged_expired_and_out_of_range_grants(client):
    from kvstore.transport.tcp_client import TcpTransport

    seg, _ = _tcp_address(client)
    info = next(s for d in client.stats().daemons for s in d.segments if s.segment_id == seg.segment_id)
    t = TcpTransport()
    try:
        forged = Grant(seg.segment_id, 0, 16, GrantMode.WRITE, 2**62, b"\x00" * 16)
        with pytest.raises(PermissionDenied):
            t.write(info, [wire_transfer(forged, bytearray(16))], deadline_in(5))
        forged_read = Grant(seg.segment_id, 0, 16, GrantMode.READ, 2**62, b"\x01" * 16)
        with pytest.raises(PermissionDenied):
            t.read(info, [wire_transfer(forged_read, bytearray(16))], deadline_in(5))
        beyond = Grant(seg.segment_id, seg.capacity - 8, 16, GrantMode.READ, 2**62, b"\x02" * 16)
        with pytest.raises((PermissionDenied, InvalidArgument, TransportError)):
            t.read(info, [wire_transfer(beyond, bytearray(16))], deadline_in(5))
    finally:
        t.close()


def wire_transfer(grant, buf):
    from kvstore.transport.base import Transfer

    return Transfer(grant, memoryview(buf))


def deadline_in(seconds):
    import time

    return time.monotonic() + seconds


@pytest.mark.parametrize("transport", ["tcp", "shm"])  # checked by the daemon / by the client
def test_stale_grant_is_refused(client, served, transport):
    from kvstore.transport import registry

    resp = raw_stub(served).Get(pb.GetRequest(keys=["keep/3"]))
    g = convert.grant_from_pb(resp.results[0].replicas[0])
    seg = convert.segments_by_id(resp.segments)[g.segment_id]
    expired = Grant(g.segment_id, g.offset, g.length, g.mode, 1, g.mac)  # MAC no longer matches either
    t = registry.client_class(transport)()
    try:
        with pytest.raises(PermissionDenied):
            t.read(seg, [wire_transfer(expired, bytearray(g.length))], deadline_in(5))
        buf = bytearray(g.length)
        t.read(seg, [wire_transfer(g, buf)], deadline_in(5))  # the real grant works
        assert bytes(buf) == COMMITTED["keep/3"]
    finally:
        t.close()
