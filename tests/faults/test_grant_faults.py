"""Stale, replayed and slow grants against a real daemon: none ever reads or writes bytes of an
allocation other than its own, or rewrites a committed value."""

from __future__ import annotations

import socket
import time

import pytest

from kvstore.checksum import checksum
from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import ErrorCode, PermissionDenied, TransportError
from kvstore.metaclient.client import MetaClient
from kvstore.results import PutWritten
from kvstore.transport.base import Transfer
from kvstore.transport.tcp_client import TcpTransport
from kvstore.transport.tcp_wire import REPLY_HEADER, encode_request, recv_exact
from kvstore.wire.calls import Get, PutEnd, PutStart, Remove
from tests.cluster import wait_until
from tests.meta_helpers import endpoint_address

SIZE = 1 << 20
SHORT = {"KVSTORE_META_LEASE_TTL_S": "2", "KVSTORE_META_WRITE_GRANT_TTL_S": "2", "KVSTORE_META_PUT_LEASE_TTL_S": "3"}


@pytest.fixture
def one_segment(faults):
    """A service with short leases and grants, and one daemon with one 2 MiB segment."""
    _, meta = faults.meta(SHORT)
    faults.daemon(meta, "2MiB", None, "--segment-size", "2MiB")
    return meta


def tcp_put(meta: MetaClient, tcp: TcpTransport, key: str, data: bytes):
    reply = meta.call(PutStart([key], [len(data)]))
    [result] = reply.results
    [grant] = result.grants
    segment = reply.segments[grant.segment_id]
    written = tcp.write(segment, [Transfer(grant, memoryview(data))], time.monotonic() + 10)
    meta.call(PutEnd([key], [checksum(data)], [PutWritten(0, tuple(written.receipts or ()))]))
    return grant, segment


def test_a_replayed_write_grant_cannot_rewrite_a_committed_value(faults, one_segment):
    with MetaClient(one_segment) as meta, KVClient(one_segment, ClientConfig(transports=("tcp",))) as client:
        tcp = TcpTransport()
        grant, segment = tcp_put(meta, tcp, "a", b"A" * SIZE)
        with pytest.raises(PermissionDenied, match="used already"):
            tcp.write(segment, [Transfer(grant, memoryview(b"X" * SIZE))], time.monotonic() + 10)
        assert client.get("a") == b"A" * SIZE
        tcp.close()


def test_an_old_read_grant_never_returns_another_keys_bytes(faults, one_segment):
    with MetaClient(one_segment) as meta, KVClient(one_segment, ClientConfig(transports=("tcp",))) as client:
        tcp = TcpTransport()
        tcp_put(meta, tcp, "a", b"A" * SIZE)
        got = meta.call(Get(["a"], client_id="reader"))
        [result] = got.results
        old, segment = result.grants[0], got.segments[result.grants[0].segment_id]
        meta.call(Remove(["a"], released=[result.lease_id], client_id="reader"))  # done reading, key gone
        seen_refusal = False
        deadline = time.monotonic() + 20
        placed = 0
        while time.monotonic() < deadline and not seen_refusal:
            try:  # fill the segment with other keys, as fast as it lets us
                client.put(f"b/{placed}", b"B" * SIZE)
                placed += 1
            except Exception:  # noqa: BLE001 - NoSpace while the old space is held
                pass
            out = bytearray(SIZE)
            try:
                tcp.read(segment, [Transfer(old, memoryview(out))], time.monotonic() + 10)
                assert bytes(out) == b"A" * SIZE  # its own allocation's bytes, or nothing
            except PermissionDenied:
                seen_refusal = True  # expired: refused
            except TransportError:
                pass  # cut off at its expiry, part way: nothing of another key's
        assert seen_refusal
        wait_until(lambda: _put_ok(client, "c", b"C" * SIZE), timeout=30, what="the old space reused")
        assert client.get("c") == b"C" * SIZE
        tcp.close()


def _put_ok(client: KVClient, key: str, data: bytes) -> bool:
    try:
        client.put(key, data)
        return True
    except Exception:  # noqa: BLE001 - not yet
        return False


def test_a_stalled_writer_is_cut_off_at_its_grant_and_others_are_served(faults, one_segment):
    with MetaClient(one_segment) as meta, KVClient(one_segment, ClientConfig(transports=("tcp",))) as client:
        reply = meta.call(PutStart(["slow"], [SIZE]))
        [grant] = reply.results[0].grants
        address = endpoint_address(reply.segments[grant.segment_id], "tcp")
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(encode_request(grant.segment_id, grant.mode, [grant]) + b"s" * 1000)  # then stalls
            client.put("other", b"o" * 1000)  # others are served meanwhile
            assert client.get("other") == b"o" * 1000
            sock.settimeout(30)
            try:
                assert sock.recv(1) == b""  # closed at the grant's expiry, with no receipt
            except ConnectionResetError:
                pass
            with pytest.raises(OSError):  # what it sends now lands nowhere
                for _ in range(64):
                    sock.sendall(b"s" * 65536)
        wait_until(lambda: client.stats().pending == 0, timeout=30, what="the stalled put revoked")
        assert client.get("other") == b"o" * 1000


def test_a_daemon_refuses_a_read_grant_once_it_expired(faults, one_segment):
    """Sent raw, past the client library's own check: the daemon itself refuses it."""
    with MetaClient(one_segment) as meta:
        tcp = TcpTransport()
        tcp_put(meta, tcp, "a", b"A" * 4096)
        got = meta.call(Get(["a"], client_id="r"))
        grant = got.results[0].grants[0]
        host, port = endpoint_address(got.segments[grant.segment_id], "tcp").rsplit(":", 1)
        wait_until(lambda: grant.expires_ms < time.time() * 1000 - 100, timeout=10, what="the grant to expire")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(encode_request(grant.segment_id, grant.mode, [grant]))
            _magic, _version, status, size = REPLY_HEADER.unpack(
                recv_exact(sock, REPLY_HEADER.size, time.monotonic() + 10)
            )
            assert status == ErrorCode.PERMISSION_DENIED
            assert b"expired" in recv_exact(sock, size, time.monotonic() + 10)
        tcp.close()
