"""`tcp`: the data plane over plain TCP, for any host and no extra dependencies.

Wire format, version 1, little-endian. A connection carries any number of requests, one at a
time; a request moves many blocks of one segment in one direction.

    request = REQUEST_HEADER  segment_id  ITEM * count  padding  [payload]
      REQUEST_HEADER "<4sBBHI"  magic b"KVTP", version 1, op (GrantMode: 1 READ, 2 WRITE),
                                len(segment_id) in 1..1024, count in 0..65536
      segment_id                UTF-8; the segment every item's grant names
      ITEM "<QQBQ16s"           a grant: offset, length, mode, expires_ms, mac; the item moves
                                exactly [offset, offset + length)
      padding                   zero bytes up to a multiple of 16 from the request's start
      payload                   WRITE only: the items' bytes back to back, in item order
    reply   = REPLY_HEADER  message  [payload]
      REPLY_HEADER "<4sBBxxI4x" magic, version, status (kvstore.errors.ErrorCode), len(message)
      message                   UTF-8, at most 64 KiB; empty on OK
      payload                   READ with status OK only: the items' bytes, in item order

Headers are padded to 16 bytes so that a payload keeps its alignment through the kernel's socket
buffers: a payload 12 bytes off alignment made loopback copies about twice as slow.

The daemon checks every grant of a request before it moves any byte. A refused READ gets an error
reply and the connection stays usable; a refused WRITE gets an error reply and a close, unread,
since its payload is already in flight. A malformed header gets an error reply and a close; a
connection that fails mid-payload is closed. Payload moves straight between the socket and segment
views on the daemon, and the caller's buffers on the client.

Endpoint address: "host:port" ("[host]:port" for IPv6).
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from typing import Sequence

from kvstore.config import DaemonConfig
from kvstore.errors import ErrorCode, InvalidArgument, KVStoreError, TransportError, error_for
from kvstore.storage.base import SegmentStorage
from kvstore.transport.base import GrantChecker, Transfer, Transport, TransportServer, checked_view
from kvstore.transport.framing import (ITEM, MAGIC, MAX_ITEMS, MAX_MESSAGE_BYTES, MAX_SEGMENT_ID_BYTES,
                                       REPLY_HEADER, REQUEST_HEADER, VERSION, _HASH_PIECE, _join_address,
                                       _recv_buffers, _recv_exact, _recv_hashed, _reply, _send_buffers,
                                       _table_bytes, _tune)
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo

_MAX_IDLE_PER_ADDRESS = 16
_log = logging.getLogger(__name__)


# --- client -------------------------------------------------------------------------------------

def _encode_request(segment_id: str, mode: GrantMode, grants: Sequence[Grant]) -> bytes:
    """Request header and item table; a WRITE payload follows it unjoined."""
    sid = segment_id.encode()
    if not 0 < len(sid) <= MAX_SEGMENT_ID_BYTES:
        raise InvalidArgument(f"segment id of {len(sid)} bytes; tcp allows 1..{MAX_SEGMENT_ID_BYTES}")
    try:
        items = [ITEM.pack(g.offset, g.length, int(g.mode), g.expires_ms, g.mac) for g in grants]
    except struct.error as exc:
        raise InvalidArgument(f"a grant field does not fit the tcp wire format: {exc}") from exc
    head = REQUEST_HEADER.pack(MAGIC, VERSION, int(mode), len(sid), len(grants))
    padding = bytes(_table_bytes(len(sid), len(grants)) - len(sid) - ITEM.size * len(grants))
    return b"".join([head, sid, *items, padding])


def _read_reply(sock: socket.socket, deadline: float, address: str) -> None:
    """Consume one reply header and message; raise the typed error it carries unless OK."""
    magic, version, status, size = REPLY_HEADER.unpack(_recv_exact(sock, REPLY_HEADER.size, deadline))
    if magic != MAGIC or version != VERSION or size > MAX_MESSAGE_BYTES:
        raise TransportError(f"{address} sent a malformed reply; is it a kvstore tcp daemon of this version?")
    message = _recv_exact(sock, size, deadline).decode("utf-8", "replace")
    if status != ErrorCode.OK:
        code = status if status in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
        raise error_for(code, f"daemon at {address}: {message}")


def _send_write(sock: socket.socket, request: bytes, buffers: list[memoryview], deadline: float,
                address: str) -> None:
    try:
        _send_buffers(sock, [request, *buffers], deadline)
    except OSError as exc:
        # The daemon may have refused a grant and closed before taking the payload; its error
        # reply, if one arrived, says why.
        try:
            _read_reply(sock, deadline, address)
        except KVStoreError as refusal:
            raise refusal from exc
        except OSError:
            pass
        raise exc


def _connect(address: str, deadline: float) -> socket.socket:
    host, _, port = address.rpartition(":")
    try:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=remaining)
    except (OSError, ValueError) as exc:
        raise TransportError(f"cannot connect to the tcp daemon at {address}: {exc}; check that the "
                             "daemon is running and its port is reachable") from exc
    sock.settimeout(None)
    _tune(sock)
    return sock


def _still_idle(sock: socket.socket) -> bool:
    """Whether a pooled connection is open with nothing unread (else the daemon closed it)."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


class TcpTransport(Transport):
    """Pools idle connections per daemon address. A connection serves one call at a time and goes
    back to the pool only after an exchange that left its stream in sync. Nothing is cached per
    segment (forget() has nothing to drop); a pooled connection the daemon closed is dropped when
    next checked out."""

    name = "tcp"

    def __init__(self) -> None:
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> None:
        self._move(segment, transfers, GrantMode.WRITE, deadline)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        """Reads of large blocks come back with their checksums, hashed as each piece arrived."""
        return self._move(segment, transfers, GrantMode.READ, deadline)

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode,
              deadline: float) -> list[int] | None:
        ep = segment.endpoint(self.name)
        if ep is None:
            raise TransportError(f"segment {segment.segment_id} offers no tcp endpoint")
        buffers = [checked_view(segment, t, mode, "tcp") for t in transfers]
        hashed = mode is GrantMode.READ and sum(b.nbytes for b in buffers) >= len(buffers) * _HASH_PIECE
        digests: list[int] = []
        for start in range(0, len(transfers), MAX_ITEMS):
            batch = slice(start, start + MAX_ITEMS)
            request = _encode_request(segment.segment_id, mode, [t.grant for t in transfers[batch]])
            digests += self._exchange(ep.address, mode, request, buffers[batch], deadline, hashed)
        return digests if hashed else None

    def _exchange(self, address: str, mode: GrantMode, request: bytes, buffers: list[memoryview],
                  deadline: float, hashed: bool = False) -> list[int]:
        """One request and its reply on a pooled connection; with `hashed`, the read buffers'
        checksums."""
        sock = self._checkout(address, deadline)
        keep = False
        digests: list[int] = []
        try:
            if mode is GrantMode.WRITE:
                _send_write(sock, request, buffers, deadline, address)
            else:
                _send_buffers(sock, [request], deadline)
            _read_reply(sock, deadline, address)
            if mode is GrantMode.READ and hashed:
                digests = _recv_hashed(sock, buffers, deadline)
            elif mode is GrantMode.READ:
                _recv_buffers(sock, buffers, deadline)
            keep = True
        except KVStoreError as exc:      # a refused read leaves the stream in sync; a write does not
            keep = mode is GrantMode.READ and not isinstance(exc, TransportError)
            raise
        except OSError as exc:
            what = "the deadline passed" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            raise TransportError(f"tcp transfer with the daemon at {address} failed: {what}; the daemon "
                                 "may have stopped, or it or the network is overloaded") from exc
        finally:
            if keep:
                self._checkin(address, sock)
            else:
                sock.close()
        return digests

    def _checkout(self, address: str, deadline: float) -> socket.socket:
        with self._lock:
            if self._closed:
                raise TransportError("this tcp transport was closed")
            idle = self._idle.get(address, [])
            while idle:
                sock = idle.pop()
                if _still_idle(sock):
                    return sock
                sock.close()
        return _connect(address, deadline)

    def _checkin(self, address: str, sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(address, [])
            if not self._closed and len(idle) < _MAX_IDLE_PER_ADDRESS:
                idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        """Close idle connections; those in use close when their call ends."""
        with self._lock:
            self._closed = True
            idle = [s for socks in self._idle.values() for s in socks]
            self._idle.clear()
        for sock in idle:
            sock.close()


# --- server -------------------------------------------------------------------------------------

_Placed = tuple[SegmentStorage, Grant]      # a checked grant and the segment it is for


def _parse_header(head: bytes) -> tuple[GrantMode, int, int]:
    """(op, segment id length, item count) of a request header; InvalidArgument if malformed."""
    magic, version, op, id_len, count = REQUEST_HEADER.unpack(head)
    if (magic != MAGIC or version != VERSION or op not in (GrantMode.READ, GrantMode.WRITE)
            or not 0 < id_len <= MAX_SEGMENT_ID_BYTES or count > MAX_ITEMS):
        raise InvalidArgument(f"malformed tcp request header (magic {bytes(magic)!r}, version {version}, "
                              f"op {op}, segment id of {id_len} bytes, {count} items)")
    return GrantMode(op), id_len, count


class TcpServer(TransportServer):
    """An accept thread and a thread per connection; `port` is the bound port once started."""

    name = "tcp"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._checker = checker
        self._host = config.host
        self.port = config.tcp_port
        self._listener: socket.socket | None = None
        self._accepter: threading.Thread | None = None
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def start(self) -> None:
        """Listen on host:tcp_port (0: any free port) and accept in a background thread."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            self._listener = socket.create_server((self._host, self.port), family=family, backlog=128)
        except OSError as exc:
            raise TransportError(f"tcp transport cannot listen on {_join_address(self._host, self.port)}: "
                                 f"{exc}; pick another tcp_port, or 0 for any free one") from exc
        self._listener.settimeout(0.5)      # stop() wakes accept() by shutdown; this is the fallback
        self.port = self._listener.getsockname()[1]
        self._accepter = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"kvstore-tcp-{self.port}")
        self._accepter.start()

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        host = socket.gethostname() if self._host in ("", "0.0.0.0", "::") else self._host
        return Endpoint(self.name, _join_address(host, self.port))

    def stop(self) -> None:
        """Close the listener and every open connection, then wait (at most 5 s) for the threads."""
        self._stopping.set()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        with self._lock:                    # a connection still listed is not closed yet
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
                conn, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                self._stopping.wait(0.05)   # e.g. out of file descriptors: retry without spinning
                continue
            _tune(conn)
            thread = threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                                      name=f"kvstore-tcp-{peer}")
            with self._lock:
                if self._stopping.is_set():
                    conn.close()
                    return
                self._conns[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket, peer: object) -> None:
        try:
            while self._serve_one(conn):
                pass
        except OSError:
            pass                            # the client went away mid-request
        except Exception:
            _log.exception("tcp: request from %s failed; closing its connection", peer)
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def _serve_one(self, conn: socket.socket) -> bool:
        """Answer one request; False when the connection must close."""
        head = bytearray(REQUEST_HEADER.size)
        got = conn.recv_into(head)
        if got == 0:
            return False                    # closed between requests
        _recv_buffers(conn, [memoryview(head)[got:]], None)
        try:
            mode, id_len, count = _parse_header(head)
        except InvalidArgument as exc:
            conn.sendall(_reply(exc.code, str(exc)))
            return False
        body = _recv_exact(conn, _table_bytes(id_len, count), None)
        try:
            table = memoryview(body)[id_len:id_len + count * ITEM.size]
            placed = self._check(bytes(body[:id_len]).decode(), mode, table)
        except (KVStoreError, ValueError) as exc:    # ValueError: bad UTF-8 or grant mode
            conn.sendall(_reply(getattr(exc, "code", ErrorCode.INVALID_ARGUMENT), str(exc)))
            return mode is GrantMode.READ
        if mode is GrantMode.WRITE:
            self._receive_payload(conn, placed)
        else:
            self._send_payload(conn, placed)
        return True

    def _check(self, segment_id: str, mode: GrantMode, table: memoryview) -> list[_Placed]:
        """Each item's grant with its segment; raises for the first grant that does not check."""
        placed = []
        for offset, length, grant_mode, expires_ms, mac in ITEM.iter_unpack(table):
            grant = Grant(segment_id, offset, length, GrantMode(grant_mode), expires_ms, mac)
            placed.append((self._checker.check(grant, mode), grant))
        return placed

    @staticmethod
    def _receive_payload(conn: socket.socket, placed: list[_Placed]) -> None:
        """Receive a WRITE payload straight into segment memory (or bounce buffers), then reply."""
        targets, bounced = [], []
        for segment, g in placed:
            view = segment.view(g.offset, g.length)
            if view is None:
                view = memoryview(bytearray(g.length))
                bounced.append((segment, g.offset, view))
            targets.append(view)
        _recv_buffers(conn, targets, None)
        try:
            for segment, offset, data in bounced:
                segment.write_from(offset, data)
        except (OSError, ValueError) as exc:
            conn.sendall(_reply(ErrorCode.INTERNAL, f"storing the written bytes failed: {exc}"))
            return
        conn.sendall(_reply(ErrorCode.OK, ""))

    @staticmethod
    def _send_payload(conn: socket.socket, placed: list[_Placed]) -> None:
        """Reply OK and the granted ranges, sent straight from segment memory (or bounce buffers)."""
        if all(segment.view(g.offset, 0) is None and hasattr(segment, "sendfile") for segment, g in placed):
            # File-backed (SSD): the kernel moves the bytes file -> socket, no copy through Python.
            _send_buffers(conn, [_reply(ErrorCode.OK, "")], None)
            for segment, g in placed:
                segment.sendfile(conn, g.offset, g.length)
            return
        sources = []
        try:
            for segment, g in placed:
                sources.append(segment.readable(g.offset, g.length))
        except (OSError, ValueError) as exc:
            conn.sendall(_reply(ErrorCode.INTERNAL, f"loading the requested bytes failed: {exc}"))
            return
        _send_buffers(conn, [_reply(ErrorCode.OK, ""), *sources], None)
