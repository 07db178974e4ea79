"""The tcp transport against a real in-process TcpServer on port 0: round trips, batches,
concurrency, hostile input on raw sockets, and failure of calls to a daemon that went away."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kvstore.clock import FakeClock
from kvstore.config import ClientConfig, DaemonConfig
from kvstore.errors import ErrorCode, InvalidArgument, PermissionDenied, TransportError
from kvstore.grant import LOCAL
from kvstore.transport import tcp_client
from kvstore.transport import tcp_wire as tcp
from kvstore.transport.base import Transfer
from kvstore.transport.tcp_client import TcpTransport
from kvstore.transport.tcp_server import TcpServer
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo, Tier
from tests.transport_harness import CAPACITY, BytesSegment, Daemon, deadline, get, put, round_trips_from_threads

NOW_MS = 1_700_000_000_000  # the daemon's clock: grants expire by it, not by wall time
LATER_MS = NOW_MS + 60_000


@pytest.fixture
def daemon(tmp_path) -> Iterator[Daemon[TcpServer]]:
    d = Daemon(
        str(tmp_path), TcpServer, plain=BytesSegment("seg-plain", 1 << 20, Tier.DRAM), clock=FakeClock(NOW_MS / 1000)
    )
    yield d
    d.close()


@pytest.fixture
def client() -> Iterator[TcpTransport]:
    c = TcpTransport.from_config(ClientConfig(), FakeClock(NOW_MS / 1000))  # the daemon's clock
    assert isinstance(c, TcpTransport)  # from_config is typed to return the base Transport
    yield c
    c.close()


def raw_request(mode: GrantMode, grants: list[Grant], segment_id: str = "seg-dram") -> bytes:
    return tcp.encode_request(segment_id, mode, grants)


def raw_connect(daemon: Daemon[TcpServer]) -> socket.socket:
    return socket.create_connection(("127.0.0.1", daemon.server.port), timeout=10)


def read_reply(sock: socket.socket) -> tuple[int, str]:
    head = tcp.recv_exact(sock, tcp.REPLY_HEADER.size, deadline())
    magic, version, status, size = tcp.REPLY_HEADER.unpack(head)
    assert (magic, version) == (tcp.MAGIC, tcp.VERSION)
    return status, tcp.recv_exact(sock, size, deadline()).decode()


def assert_closed(sock: socket.socket) -> None:
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def assert_still_serving(daemon: Daemon[TcpServer], before: bytes) -> None:
    """The daemon serves a new connection, and the hostile request changed no byte."""
    assert daemon.snapshot() == before
    fresh = TcpTransport(clock=daemon.clock)
    try:
        assert get(daemon, fresh, 0, 4096) == before[:4096]
    finally:
        fresh.close()


@pytest.fixture
def seeded(daemon: Daemon[TcpServer], client: TcpTransport) -> bytes:
    put(daemon, client, 0, os.urandom(1 << 20))
    return daemon.snapshot()


# --- behaviour -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 100, 4096, 65537, 1 << 20, (8 << 20) + 3])
def test_round_trip_is_byte_identical(daemon: Daemon[TcpServer], client: TcpTransport, size: int) -> None:
    data = os.urandom(size)
    put(daemon, client, 12345, data)
    assert bytes(daemon.dram.view(12345, size)) == data
    assert get(daemon, client, 12345, size) == data


@pytest.mark.parametrize("count", [1000, 3000])  # 3000: more buffers than one sendmsg takes
def test_batch_of_small_blocks_uses_one_connection(daemon: Daemon[TcpServer], client: TcpTransport, count: int) -> None:
    blocks = [os.urandom(100 + i % 37) for i in range(count)]
    offsets = [i * 256 for i in range(count)]
    info = daemon.info(daemon.dram)
    client.write(
        info,
        [Transfer(daemon.grant(o, len(b), GrantMode.WRITE), memoryview(b)) for o, b in zip(offsets, blocks)],
        deadline(),
    )
    outs = [bytearray(len(b)) for b in blocks]
    client.read(
        info,
        [
            Transfer(daemon.grant(o, len(b), GrantMode.READ), memoryview(out))
            for o, b, out in zip(offsets, blocks, outs)
        ],
        deadline(),
    )
    assert [bytes(o) for o in outs] == blocks
    assert client.idle(info.endpoints[0].address) == 1


def test_batches_over_the_item_limit_are_split(daemon: Daemon[TcpServer], client: TcpTransport, monkeypatch) -> None:
    monkeypatch.setattr(tcp, "MAX_ITEMS", 7)  # the daemon refuses more than 7 items a request
    monkeypatch.setattr(tcp_client, "MAX_ITEMS", 7)  # ... so the client must split
    blocks = [bytes([i]) * 10 for i in range(50)]
    info = daemon.info(daemon.dram)
    client.write(
        info,
        [Transfer(daemon.grant(i * 10, 10, GrantMode.WRITE), memoryview(b)) for i, b in enumerate(blocks)],
        deadline(),
    )
    assert get(daemon, client, 0, 500) == b"".join(blocks)


def test_eight_threads_share_one_transport(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    round_trips_from_threads(daemon, client, rounds=40, size_step=997)


def test_segment_without_view_uses_bounce_buffers(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    assert isinstance(daemon.plain, BytesSegment)  # the harness's default segment without view()
    info, data = daemon.info(daemon.plain), os.urandom(5000)
    client.write(info, [Transfer(daemon.grant(7, 5000, GrantMode.WRITE, "seg-plain"), memoryview(data))], deadline())
    assert bytes(daemon.plain.data[7:5007]) == data
    out = bytearray(5000)
    client.read(info, [Transfer(daemon.grant(7, 5000, GrantMode.READ, "seg-plain"), memoryview(out))], deadline())
    assert out == data


def test_reads_into_typed_buffers(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    data = os.urandom(4096)
    put(daemon, client, 0, data)
    out = memoryview(bytearray(4096)).cast("I")
    client.read(daemon.info(daemon.dram), [Transfer(daemon.grant(0, 4096, GrantMode.READ), out)], deadline())
    assert out.tobytes() == data


# --- refused grants through the client ------------------------------------------------------


@pytest.mark.parametrize("mode", [GrantMode.READ, GrantMode.WRITE])
@pytest.mark.parametrize("bad", ["forged", "expired", "out_of_range", "unknown_segment"])
def test_bad_grants_are_refused(
    daemon: Daemon[TcpServer], client: TcpTransport, seeded: bytes, mode: GrantMode, bad: str
) -> None:
    info, good = daemon.info(daemon.dram), daemon.grant(0, 4096, mode)
    if bad == "forged":
        grant = Grant(good.segment_id, good.offset, good.length, mode, good.expires_ms, bytes(16))
    elif bad == "expired":
        grant = daemon.grant(0, 4096, mode, expires_ms=NOW_MS - 1)
    elif bad == "out_of_range":
        grant = daemon.grant(CAPACITY - 100, 4096, mode)
    else:
        grant = daemon.grant(0, 4096, mode, segment="nope")
        info = SegmentInfo("nope", "d1", Tier.DRAM, CAPACITY, info.endpoints)
    # A valid item first: nothing moves unless every grant of the request checks.
    transfers = [Transfer(grant, memoryview(bytearray(4096)))]
    if bad != "unknown_segment":
        transfers.insert(0, Transfer(good, memoryview(bytearray(4096))))
    with pytest.raises(PermissionDenied):
        (client.write if mode is GrantMode.WRITE else client.read)(info, transfers, deadline())
    assert_still_serving(daemon, seeded)
    assert get(daemon, client, 0, 100) == seeded[:100]  # the pooled client recovers too


def test_refused_large_write_reports_the_refusal(
    daemon: Daemon[TcpServer], client: TcpTransport, seeded: bytes
) -> None:
    grant = daemon.grant(0, 16 << 20, GrantMode.WRITE, expires_ms=NOW_MS - 1)
    with pytest.raises(PermissionDenied, match="expired"):
        client.write(daemon.info(daemon.dram), [Transfer(grant, memoryview(bytearray(16 << 20)))], deadline())
    assert_still_serving(daemon, seeded)


def test_client_checks_buffers_against_grants(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    info, read_grant = daemon.info(daemon.dram), daemon.grant(0, 10, GrantMode.READ)
    for transfer in (
        Transfer(read_grant, memoryview(bytearray(9))),  # wrong size
        Transfer(daemon.grant(0, 10, GrantMode.WRITE), memoryview(bytearray(10))),
        Transfer(read_grant, memoryview(bytes(10))),  # read-only
        Transfer(read_grant, memoryview(bytearray(20))[::2]),  # strided
    ):
        with pytest.raises(InvalidArgument):
            client.read(info, [transfer], deadline())


# --- hostile input on raw sockets -----------------------------------------------------------


def test_wrong_mode_read_is_refused_and_connection_stays_usable(daemon: Daemon[TcpServer], seeded: bytes) -> None:
    with raw_connect(daemon) as sock:
        sock.sendall(raw_request(GrantMode.READ, [daemon.grant(0, 10, GrantMode.WRITE)]))
        assert read_reply(sock)[0] == ErrorCode.PERMISSION_DENIED
        sock.sendall(raw_request(GrantMode.READ, [daemon.grant(0, 10, GrantMode.READ)]))
        assert read_reply(sock)[0] == ErrorCode.OK
        assert tcp.recv_exact(sock, 10, deadline()) == seeded[:10]
    assert_still_serving(daemon, seeded)


def test_absurd_lengths_are_refused(daemon: Daemon[TcpServer], seeded: bytes) -> None:
    with raw_connect(daemon) as sock:
        for offset, length in ((0, 2**64 - 1), (2**64 - 1, 1), (CAPACITY, 1)):
            sock.sendall(raw_request(GrantMode.READ, [daemon.grant(offset, length, GrantMode.READ)]))
            assert read_reply(sock)[0] == ErrorCode.PERMISSION_DENIED
    assert_still_serving(daemon, seeded)


def test_wrong_mode_write_is_refused_unread_and_closed(daemon: Daemon[TcpServer], seeded: bytes) -> None:
    with raw_connect(daemon) as sock:
        sock.sendall(raw_request(GrantMode.WRITE, [daemon.grant(0, 10, GrantMode.READ)]) + b"x" * 10)
        assert read_reply(sock)[0] == ErrorCode.PERMISSION_DENIED
        assert_closed(sock)
    assert_still_serving(daemon, seeded)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00" * 64,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        tcp.REQUEST_HEADER.pack(b"KVTQ", tcp.VERSION, 1, 8, 1),  # wrong magic
        tcp.REQUEST_HEADER.pack(tcp.MAGIC, 99, 1, 8, 1),  # wrong version
        tcp.REQUEST_HEADER.pack(tcp.MAGIC, tcp.VERSION, 3, 8, 1),  # unknown op
        tcp.REQUEST_HEADER.pack(tcp.MAGIC, tcp.VERSION, 2, 8, 0xFFFF_FFFF),  # absurd count
        tcp.REQUEST_HEADER.pack(tcp.MAGIC, tcp.VERSION, 2, 0xFFFF, 1),  # absurd segment id
        tcp.REQUEST_HEADER.pack(tcp.MAGIC, tcp.VERSION, 2, 0, 1),  # empty segment id
    ],
)
def test_malformed_headers_get_an_error_and_a_close(daemon: Daemon[TcpServer], seeded: bytes, payload: bytes) -> None:
    with raw_connect(daemon) as sock:
        sock.sendall(payload)
        assert read_reply(sock)[0] == ErrorCode.INVALID_ARGUMENT
        assert_closed(sock)
    assert_still_serving(daemon, seeded)


def test_undecodable_items_are_refused(daemon: Daemon[TcpServer], seeded: bytes) -> None:
    good = tcp.ITEM.pack(0, 10, 1, 0, LATER_MS, bytes(16))
    bad_mode = tcp.ITEM.pack(0, 10, 7, 0, LATER_MS, bytes(16))
    for segment_id, item in ((b"\xff\xfe", good), (b"seg-dram", bad_mode)):
        with raw_connect(daemon) as sock:
            head = tcp.REQUEST_HEADER.pack(tcp.MAGIC, tcp.VERSION, 1, len(segment_id), 1)
            padding = bytes(tcp.table_bytes(len(segment_id), 1) - len(segment_id) - len(item))
            sock.sendall(head + segment_id + item + padding)
            assert read_reply(sock)[0] == ErrorCode.INVALID_ARGUMENT
    assert_still_serving(daemon, seeded)


@pytest.mark.parametrize("cut", [3, tcp.REQUEST_HEADER.size + 4, tcp.REQUEST_HEADER.size + 8 + 20, -1])
def test_truncated_requests_close_the_connection(daemon: Daemon[TcpServer], seeded: bytes, cut: int) -> None:
    request = raw_request(GrantMode.READ, [daemon.grant(0, 10, GrantMode.READ)])
    with raw_connect(daemon) as sock:
        sock.sendall(request[:cut])
        sock.shutdown(socket.SHUT_WR)
        assert_closed(sock)
    assert_still_serving(daemon, seeded)


def test_client_vanishing_mid_payload_writes_only_inside_its_grant(daemon: Daemon[TcpServer], seeded: bytes) -> None:
    grant = daemon.grant(4096, 8192, GrantMode.WRITE)
    with raw_connect(daemon) as sock:
        sock.sendall(raw_request(GrantMode.WRITE, [grant]) + b"\xaa" * 3000)
        sock.shutdown(socket.SHUT_WR)
        assert_closed(sock)
    after = daemon.snapshot()
    assert after[:4096] == seeded[:4096] and after[4096 + 8192 :] == seeded[4096 + 8192 :]
    assert_still_serving(daemon, after)


# --- a daemon that goes away ------------------------------------------------------------------


def test_stopping_the_server_fails_a_pending_call_promptly(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    assert isinstance(daemon.plain, BytesSegment)  # the harness's default segment without view()
    daemon.plain.release.clear()
    failures: list[BaseException] = []

    def reader() -> None:
        out = memoryview(bytearray(10))
        try:
            client.read(
                daemon.info(daemon.plain),
                [Transfer(daemon.grant(0, 10, GrantMode.READ, "seg-plain"), out)],
                deadline(30),
            )
        except BaseException as exc:  # noqa: BLE001 - checked by the main thread
            failures.append(exc)

    pending = threading.Thread(target=reader)
    pending.start()
    assert daemon.plain.entered.wait(10)
    stopper = threading.Thread(target=daemon.server.stop)
    stopper.start()
    pending.join(5)
    assert not pending.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], TransportError)
    daemon.plain.release.set()
    stopper.join(10)
    assert not stopper.is_alive()


def test_connection_refused_is_a_transport_error(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    info = daemon.info(daemon.dram)
    put(daemon, client, 0, b"x")  # leaves a pooled connection behind
    daemon.server.stop()
    with pytest.raises(TransportError, match=info.endpoints[0].address):
        get(daemon, client, 0, 1)


def test_silent_daemon_fails_at_the_deadline(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        info = SegmentInfo("seg-dram", "d1", Tier.DRAM, CAPACITY, (Endpoint("tcp", address),))
        out = memoryview(bytearray(10))
        with pytest.raises(TransportError, match="deadline"):
            client.read(info, [Transfer(daemon.grant(0, 10, GrantMode.READ), out)], time.monotonic() + 0.2)


def test_stop_closes_idle_connections_and_ends_their_threads(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    put(daemon, client, 0, b"abc")
    idle = [raw_connect(daemon) for _ in range(5)]
    for sock in idle:  # served once, so each has its own thread
        sock.sendall(raw_request(GrantMode.READ, [daemon.grant(0, 3, GrantMode.READ)]))
        assert read_reply(sock)[0] == ErrorCode.OK and tcp.recv_exact(sock, 3, deadline()) == b"abc"
    daemon.server.stop()
    assert daemon.server.connections == 0
    for sock in idle:
        assert_closed(sock)
        sock.close()


def test_pooled_connections_survive_a_daemon_restart(daemon: Daemon[TcpServer], client: TcpTransport) -> None:
    put(daemon, client, 0, b"before")
    daemon.restart(DaemonConfig(tcp_port=daemon.server.port))
    assert get(daemon, client, 0, 6) == b"before"


# --- a grant reaches only its own allocation, once, and only in its time -----------------------


def test_a_write_grant_writes_once(daemon: Daemon[TcpServer], client: TcpTransport, seeded: bytes) -> None:
    grant = daemon.grant(0, 10, GrantMode.WRITE)
    info = daemon.info(daemon.dram)
    written = client.write(info, [Transfer(grant, memoryview(b"committed!"))], deadline())
    assert written.receipts == [daemon.signer.receipt(grant)]
    with pytest.raises(PermissionDenied, match="used already"):  # a replay cannot rewrite it
        client.write(info, [Transfer(grant, memoryview(b"rewritten!"))], deadline())
    assert get(daemon, client, 0, 10) == b"committed!"


def test_a_request_that_repeats_a_write_grant_is_refused_whole(
    daemon: Daemon[TcpServer], client: TcpTransport, seeded: bytes
) -> None:
    grant = daemon.grant(0, 10, GrantMode.WRITE)
    with pytest.raises(PermissionDenied):
        client.write(daemon.info(daemon.dram), [Transfer(grant, memoryview(b"a" * 10))] * 2, deadline())
    assert_still_serving(daemon, seeded)


def test_local_grants_are_refused_over_the_network(
    daemon: Daemon[TcpServer], client: TcpTransport, seeded: bytes
) -> None:
    for mode in (GrantMode.READ, GrantMode.WRITE):
        local = daemon.signer.sign("seg-dram", 0, 10, mode, LATER_MS, LOCAL)
        call = client.write if mode is GrantMode.WRITE else client.read
        with pytest.raises(PermissionDenied, match="same-host"):
            call(daemon.info(daemon.dram), [Transfer(local, memoryview(bytearray(10)))], deadline())
    assert_still_serving(daemon, seeded)


def test_the_bounce_piece_fits_the_largest_item_not_the_first():
    # sized by the first item, a batch led by a 1-byte value moved every later one a byte a send
    # (1000 small values from a GPU segment: past the read grant's 5 s on a loaded host)
    from kvstore.checksum import PIECE
    from kvstore.transport.tcp_server import _bounce

    def placed(*lengths):
        return [(None, Grant("s", 0, n, GrantMode.READ, LATER_MS, b"")) for n in lengths]

    assert len(_bounce(placed(1, 300, 7))) == 300
    assert len(_bounce(placed(1, 1 << 30))) == PIECE * 8
