"""The daemon side of the `tcp` transport (the wire format is described in tcp_wire.py): an
accept thread and a thread per connection, under connection caps (kvstore.connlimit)."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Sequence

from kvstore.checksum import PIECE
from kvstore.config import DaemonConfig
from kvstore.connlimit import Admission, peer_host
from kvstore.errors import ErrorCode, InvalidArgument, KVStoreError, TransportError
from kvstore.grant import unpack_grants
from kvstore.storage.base import SegmentStorage, Sendable
from kvstore.transport.base import GrantChecker, TransportServer
from kvstore.transport.tcp_wire import (
    ITEM,
    REQUEST_HEADER,
    arm,
    encode_reply,
    join_address,
    parse_header,
    recv_buffers,
    recv_exact,
    send_buffers,
    table_bytes,
    tune,
)
from kvstore.types import Endpoint, Grant, GrantMode

_log = logging.getLogger(__name__)

_Placed = tuple[SegmentStorage, Grant]  # a checked grant and the segment it is for


class TcpServer(TransportServer):
    """An accept thread and a thread per connection; `port` is the bound port once started."""

    name = "tcp"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._checker = checker
        self._host = config.host
        self.port = self._port(config)
        self._admission = Admission(config.connection_limits)
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    @staticmethod
    def _port(config: DaemonConfig) -> int:
        return config.tcp_port

    def _open(self, conn: socket.socket) -> socket.socket:
        """The connection to serve requests on (the tls transport's is wrapped in TLS)."""
        return conn

    def start(self) -> None:
        """Listen on host:tcp_port (0: any free port) and accept in a background thread."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            self._listener = socket.create_server((self._host, self.port), family=family, backlog=128)
        except OSError as exc:
            raise TransportError(
                f"tcp transport cannot listen on {join_address(self._host, self.port)}: "
                f"{exc}; pick another tcp_port, or 0 for any free one"
            ) from exc
        self._listener.settimeout(0.5)  # stop() wakes accept() by shutdown; this is the fallback
        self.port = self._listener.getsockname()[1]
        self._accepter = threading.Thread(target=self._accept_loop, daemon=True, name=f"kvstore-tcp-{self.port}")
        self._accepter.start()

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        host = socket.gethostname() if self._host in ("", "0.0.0.0", "::") else self._host
        return Endpoint(self.name, join_address(host, self.port))

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._admission.open

    def stop(self) -> None:
        """Close the listener and every open connection, then wait (at most 5 s) for the threads."""
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._lock:  # a connection still listed is not closed yet
            threads = list(self._conns.values())
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        give_up = time.monotonic() + 5.0
        for thread in [self._accepter, *threads]:
            if thread is not None:
                thread.join(max(0.0, give_up - time.monotonic()))

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                self._stopping.wait(0.05)  # e.g. out of file descriptors: retry without spinning
                continue
            peer = peer_host(address)
            refusal = self._admission.admit(peer)
            if refusal:
                _refuse(conn, refusal)
                continue
            tune(conn)
            thread = threading.Thread(target=self._serve, args=(conn, peer), daemon=True, name=f"kvstore-tcp-{peer}")
            with self._lock:
                if self._stopping.is_set():
                    conn.close()
                    self._admission.release(peer)
                    return
                self._conns[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            conn = self._open(conn)
            while self._serve_one(conn):
                pass
        except OSError:
            pass  # the client went away, stalled past a timeout, or a grant ran out mid-payload
        except Exception:  # noqa: BLE001 - a bug must not take the daemon down
            _log.exception("tcp: request from %s failed; closing its connection", peer)
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()
            self._admission.release(peer)

    def _serve_one(self, conn: socket.socket) -> bool:
        """Answer one request; False when the connection must close."""
        limits = self._admission.limits
        head = bytearray(REQUEST_HEADER.size)
        arm(conn, socket.SO_RCVTIMEO, time.monotonic() + limits.idle_timeout_s)
        try:
            got = conn.recv_into(head)
        except (BlockingIOError, TimeoutError):
            return False  # idle past the timeout
        if got == 0:
            return False  # closed between requests
        started = time.monotonic() + limits.header_timeout_s
        recv_buffers(conn, [memoryview(head)[got:]], started)
        try:
            mode, id_len, count = parse_header(bytes(head))
        except InvalidArgument as exc:
            conn.sendall(encode_reply(exc.code, str(exc)))
            return False
        body = recv_exact(conn, table_bytes(id_len, count), started)
        try:
            table = memoryview(body)[id_len : id_len + count * ITEM.size]
            grants = unpack_grants(bytes(body[:id_len]).decode(), table)
            # Derived before the check, so the time the check takes comes out of the grants' time.
            deadline = self._checker.deadline(grants) if grants else started  # no grant: a ping, answered OK
            placed = list(zip(self._checker.check_all(grants, mode), grants, strict=True))
        except (KVStoreError, ValueError) as exc:  # ValueError: bad UTF-8
            conn.sendall(encode_reply(getattr(exc, "code", ErrorCode.INVALID_ARGUMENT), str(exc)))
            return mode is GrantMode.READ
        nbytes = sum(g.length for g in grants)
        self.observer.admit(self.name, mode, nbytes)
        begun = time.perf_counter()
        if mode is GrantMode.WRITE:
            self._receive_payload(conn, placed, deadline)
        else:
            self._send_payload(conn, placed, deadline)
        self.observer.transferred(self.name, mode, nbytes, time.perf_counter() - begun)
        return True

    def _receive_payload(self, conn: socket.socket, placed: list[_Placed], deadline: float) -> None:
        """Receive a WRITE payload straight into segment memory (tiers without a view through
        one bounce piece), then reply OK with a receipt per grant. TimeoutError if it has not all
        arrived by `deadline`: the connection closes and no receipt is given."""
        bounce: memoryview | None = None
        run: list[memoryview] = []  # consecutive items with a view: received together
        try:
            for segment, g in placed:
                view = segment.view(g.offset, g.length)
                if view is not None:
                    run.append(view)
                    continue
                recv_buffers(conn, run, deadline)
                run = []
                bounce = bounce or _bounce(placed)
                for start in range(0, g.length, len(bounce)):
                    piece = bounce[: min(len(bounce), g.length - start)]
                    recv_buffers(conn, [piece], deadline)
                    segment.write_from(g.offset + start, piece)
            recv_buffers(conn, run, deadline)
        except ValueError as exc:  # the tier refused the range
            conn.sendall(encode_reply(ErrorCode.INTERNAL, f"storing the written bytes failed: {exc}"))
            raise ConnectionAbortedError("payload not stored") from exc
        receipts = b"".join(self._checker.receipt(g) for _, g in placed)
        send_buffers(conn, [encode_reply(ErrorCode.OK, ""), receipts], deadline)

    @staticmethod
    def _send_payload(conn: socket.socket, placed: Sequence[_Placed], deadline: float) -> None:
        """Reply OK and the granted ranges, sent straight from segment memory, from files by
        sendfile, or through one bounce piece; all of it by `deadline` (else TimeoutError). The
        reply header goes out in one sendmsg with the first ranges: sent on its own, it cost a
        syscall and a loopback delivery more (server CPU per warm 4 KiB tcp get: 67-97 -> 43-77 us)."""
        bounce: memoryview | None = None
        run: list[memoryview] = [memoryview(encode_reply(ErrorCode.OK, ""))]
        for segment, g in placed:
            view = segment.view(g.offset, g.length)
            if view is not None:
                run.append(view)
                continue
            send_buffers(conn, run, deadline)
            run = []
            if isinstance(segment, Sendable) and not isinstance(conn, ssl.SSLSocket):  # file -> socket in the kernel
                segment.sendfile(conn, g.offset, g.length, deadline)
                continue
            bounce = bounce or _bounce(placed)
            for start in range(0, g.length, len(bounce)):
                piece = bounce[: min(len(bounce), g.length - start)]
                segment.read_into(g.offset + start, piece)
                send_buffers(conn, [piece], deadline)
        send_buffers(conn, run, deadline)


def _bounce(placed: Sequence[_Placed]) -> memoryview:
    """The one bounce piece of a request, as large as its largest item (up to 8 pieces): sized by
    the first item alone, a batch whose first value is tiny moved every later one in tiny sends."""
    return memoryview(bytearray(min(PIECE * 8, max(1, *(g.length for _, g in placed)))))


def _refuse(conn: socket.socket, why: str) -> None:
    """Tell a connection over the caps why, and close it (never blocking the accept loop)."""
    try:
        conn.setblocking(False)
        conn.send(encode_reply(ErrorCode.UNAVAILABLE, f"tcp daemon: {why}"))
    except OSError:
        pass
    finally:
        conn.close()
