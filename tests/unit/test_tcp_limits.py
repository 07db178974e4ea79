"""The tcp transport's time and resource limits against a real in-process TcpServer: grants that
expire mid-transfer, connection caps, idle and header timeouts. (Split from test_tcp_transport.py;
its fixtures are shared.)"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from kvstore.clock import FakeClock
from kvstore.config import DaemonConfig
from kvstore.errors import ErrorCode
from kvstore.transport import tcp_wire as tcp
from kvstore.transport.tcp_client import TcpTransport
from kvstore.transport.tcp_server import TcpServer
from kvstore.types import GrantMode
from tests.cluster import wait_until
from tests.transport_harness import Daemon, deadline, get, put
from tests.unit.test_tcp_transport import (  # noqa: F401 - client, daemon, seeded: fixtures (F811 where a test names them)
    NOW_MS,
    assert_closed,
    client,
    daemon,
    raw_connect,
    raw_request,
    read_reply,
    seeded,
)


def test_a_payload_still_arriving_when_its_grant_expires_is_cut_off(daemon: Daemon[TcpServer], seeded: bytes) -> None:  # noqa: F811
    grant = daemon.grant(0, 8192, GrantMode.WRITE, expires_ms=NOW_MS + 300)  # 0.3 s to write 8 KiB
    with raw_connect(daemon) as sock:
        sock.sendall(raw_request(GrantMode.WRITE, [grant]) + b"x" * 100)  # ... then it stalls
        assert_closed_within(sock, 10)  # closed at the grant's expiry: no reply, no receipt
    assert daemon.snapshot()[100:] == seeded[100:]  # nothing past what arrived in time
    assert_still_serving_at(daemon, 100)


def test_a_reader_still_draining_when_its_grant_expires_is_cut_off(daemon: Daemon[TcpServer], seeded: bytes) -> None:  # noqa: F811
    size = 16 << 20
    grant = daemon.grant(0, size, GrantMode.READ, expires_ms=NOW_MS + 300)
    with raw_connect(daemon) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        sock.sendall(raw_request(GrantMode.READ, [grant]))
        got = drain_until_closed(sock, 20)  # reads only once the daemon has given up
    assert got < size + tcp.REPLY_HEADER.size


def assert_closed_within(sock: socket.socket, seconds: float) -> None:
    sock.settimeout(seconds)
    try:
        assert sock.recv(65536) == b""
    except ConnectionResetError:
        pass


def drain_until_closed(sock: socket.socket, seconds: float) -> int:
    """Wait for the daemon to give up on this connection (its send times out at the grant's
    expiry and it closes), then read what reached us; returns the byte count."""
    sock.settimeout(seconds)
    poller_deadline = time.monotonic() + seconds
    import select

    while time.monotonic() < poller_deadline:  # the daemon's side closes: our socket reads EOF at the end
        peer_gone = select.select([], [], [sock], 0.05)[2]
        if peer_gone:
            break
        try:
            state = sock.getsockopt(socket.SOL_TCP, socket.TCP_INFO, 1)[0]
        except OSError:
            break
        if state in (8, 7):  # TCP_CLOSE_WAIT / TCP_CLOSE: the daemon closed
            break
    got = 0
    try:
        while chunk := sock.recv(1 << 20):
            got += len(chunk)
    except (ConnectionResetError, TimeoutError):
        pass
    return got


def assert_still_serving_at(target: Daemon[TcpServer], offset: int) -> None:
    fresh = TcpTransport(clock=target.clock)
    try:
        data = b"fresh bytes"
        put(target, fresh, offset + 4096, data)
        assert get(target, fresh, offset + 4096, len(data)) == data
    finally:
        fresh.close()


# --- resources: connection caps, idle and header timeouts --------------------------------------


@pytest.fixture
def strict(tmp_path) -> Iterator[Daemon[TcpServer]]:
    config = DaemonConfig(max_connections=4, max_connections_per_peer=3, idle_timeout_s=0.5, header_timeout_s=0.5)
    d = Daemon(str(tmp_path), TcpServer, config=config, clock=FakeClock(NOW_MS / 1000))
    yield d
    d.close()


def test_connections_over_the_cap_are_refused_and_others_are_served(strict: Daemon[TcpServer]) -> None:
    held = [raw_connect(strict) for _ in range(3)]
    for sock in held:
        sock.sendall(raw_request(GrantMode.READ, [strict.grant(0, 1, GrantMode.READ)]))
        assert read_reply(sock)[0] == ErrorCode.OK and tcp.recv_exact(sock, 1, deadline())
    with raw_connect(strict) as over:
        assert read_reply(over)[0] == ErrorCode.UNAVAILABLE  # typed, then closed
        assert_closed(over)
    for sock in held:
        sock.close()
    transport = TcpTransport(clock=strict.clock)
    try:
        wait_until(lambda: strict.server.connections == 0, what="the daemon to close them")
        put(strict, transport, 0, b"served")
        assert get(strict, transport, 0, 6) == b"served"
    finally:
        transport.close()


def test_idle_and_dawdling_connections_are_closed(strict: Daemon[TcpServer]) -> None:
    with raw_connect(strict) as idle, raw_connect(strict) as dawdler:
        dawdler.sendall(raw_request(GrantMode.READ, [strict.grant(0, 1, GrantMode.READ)])[:10])  # half a header
        assert_closed_within(idle, 10)
        assert_closed_within(dawdler, 10)
    wait_until(lambda: strict.server.connections == 0, what="their threads to end")
