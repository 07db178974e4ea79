"""`ucx`: the data plane as UCX tagged messages (ucxx), over the UCX transports in `ucx_tls`
(default tcp; rdma with a system UCX built with verbs).

The daemon (ucx_server.py) runs one UCX worker in one thread; a client connects to it by its
worker address and asks for transfers with small control messages. Payload moves in pieces of at
most 1 MiB, on the daemon straight into and out of segment memory (a bounce buffer for SSD and
GPU segments), on the client out of the caller's buffers and, for reads, into staging memory
copied to the caller's buffers as each piece lands (checksummed in the same pass). The daemon
checks every grant before any byte moves.

Endpoint address: "<worker address, hex>|<host_id>|<daemon pid>".

Wire format, version 1, little-endian. Every message is tagged

    tag = connection id (24 bits) | sequence number (32) | kind (8)
      kind CTRL    client -> daemon: a request (the daemon receives every CTRL, from anyone)
      kind STATUS  daemon -> client: the outcome of a request's phase
      kind DATA    payload; piece j of a request (pieces in item order, each item cut at 1 MiB
                   boundaries) has sequence number seq + 2 + j

    request = HEADER body
      HEADER "<4sBBHIII"  magic b"KVUX", version 1, op (1 READ, 2 WRITE, 3 HELLO, 4 BYE),
                          len(segment id), item count, connection id, seq
      READ/WRITE body     segment id (UTF-8), then ITEM * count: a grant "<QQBQ16s" (offset,
                          length, mode, expires_ms, mac) that moves exactly [offset, +length)
      HELLO body          "<IHH" client pid, len(host id), len(worker address), host id, the
                          client's worker address
    status = "<4sBBxxIQ" magic, version, code (kvstore.errors.ErrorCode), len(message), value;
             then the message (UTF-8, at most 4 KiB)

    READ   the daemon checks every grant and answers STATUS (seq); if OK it then sends the pieces.
           The client posts its receives only after an OK status, so a refusal leaves nothing posted.
    WRITE  the daemon checks every grant, posts receives for the pieces straight into segment
           memory, and answers STATUS (seq); after an OK the client sends the pieces, and the
           daemon answers STATUS (seq + 1) once every piece is in place.
    HELLO  sent with connection id 0: the daemon makes an endpoint back to the client's worker and
           answers STATUS (seq) with the new connection id as its value.
    BYE    the daemon closes its endpoint to the client.

Failure: UCX runs with endpoint error handling off (on, it gives up shared memory), so it never
reports a dead peer. Every client call is bounded by its deadline, and on the same host by the
daemon's pid: on either, the client closes the connection's endpoint, which cancels the receives
posted through it, and the next call reconnects. A receive already under way can still complete
(seen: a daemon stopped mid-payload and resumed finished its piece after the call had failed), so
reads land in staging memory that a failed call abandons, never in the caller's buffer. The
daemon drops a client whose request stalls (30 s, or a write grant's expiry) or whose process (on
the same host) is gone.

UCX's shared-memory transports are left out of the default ucx_tls, measured here: with sysv or
posix, one client in ~3 killed mid-write left the daemon's worker spinning and serving no one
again; with cma, a peer dying mid-transfer aborts the process doing the copy. They move 3-5 GB/s
against tcp's ~1, but on one host kvstore's own shm transport is preferred anyway. With them, at
most 1 MiB is in flight per request (several large messages at once fell to ~0.5 GB/s); over
tcp and rdma, 8 MiB.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from kvstore.checksum import copy_hashing, hasher
from kvstore.clock import Clock
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, TransportError
from kvstore.grant import RECEIPT_BYTES, pack_grants
from kvstore.hostid import host_id, pid_alive
from kvstore.transport.base import Transfer, Transport, Written, checked_view
from kvstore.transport.ucx_wire import (
    HEADER,
    HELLO,
    KIND_CTRL,
    KIND_DATA,
    KIND_STATUS,
    MAGIC,
    MAX_ITEMS,
    MAX_SEGMENT_ID_BYTES,
    OP_BYE,
    OP_HELLO,
    OP_READ,
    OP_WRITE,
    PIECE,
    POLL_MS,
    STATUS_BYTES,
    VERSION,
    Peer,
    Worker,
    check_status,
    parse_address,
    pieces,
    status_bytes,
    status_payload,
    tag,
    window,
)
from kvstore.types import Grant, GrantMode, SegmentInfo

_STAGING_KEPT = 64 << 20  # staging memory kept between reads
_STRANDED: list[Any] = []  # workers closed with requests still pending; never freed
_log = logging.getLogger(__name__)


class _Abandoned(Exception):
    """A wait gave up: the connection is closed; `why` says what happened."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class UcxTransport(Transport):
    """One UCX worker per transport, started on first use; calls take turns on it. Connections
    are kept per daemon worker address; one that timed out is closed and made anew next call."""

    name = "ucx"

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._tls = self.config.ucx_tls
        self._window = window(self._tls)
        self._ucx: Worker | None = None
        self._conns: dict[str, Peer] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self._closed = False
        # Requests a give-up left incomplete, with the buffers they point into: kept until done.
        self._stranded: list[tuple[Any, Any]] = []
        self._staging: bytearray | None = None

    def can_reach(self, segment: SegmentInfo) -> bool:
        fields = self.address_of(segment, parse_address)
        if fields is None:
            return False
        _, host, pid = fields
        return host != host_id() or pid_alive(pid)

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        """The daemon answers with a receipt per grant (for PutEnd)."""
        receipts: list[bytes] = []
        self._move(segment, transfers, GrantMode.WRITE, deadline, receipts)
        return Written(None, receipts)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        """Each piece is checksummed as it lands; returns each buffer's checksum."""
        return self._move(segment, transfers, GrantMode.READ, deadline)

    def _move(
        self,
        segment: SegmentInfo,
        transfers: Sequence[Transfer],
        mode: GrantMode,
        deadline: float,
        receipts: list[bytes] | None = None,
    ) -> list[int] | None:
        ep = segment.endpoint(self.name)
        if ep is None:
            raise TransportError(f"segment {segment.segment_id} offers no ucx endpoint")
        sid = segment.segment_id.encode()
        if not 0 < len(sid) <= MAX_SEGMENT_ID_BYTES:
            raise InvalidArgument(f"segment id of {len(sid)} bytes; ucx allows 1..{MAX_SEGMENT_ID_BYTES}")
        now = self.now_ms()
        buffers = [checked_view(segment, t, mode, self.name, now) for t in transfers]
        digests: list[int] = []
        with self._lock:
            if self._closed:
                raise TransportError("this ucx transport was closed")
            self._sweep()
            conn = self._connection(ep.address, deadline)
            try:
                for start in range(0, len(transfers), MAX_ITEMS):
                    batch = slice(start, start + MAX_ITEMS)
                    grants = [t.grant for t in transfers[batch]]
                    if mode is GrantMode.READ:
                        digests += self._read(conn, sid, grants, buffers[batch], deadline)
                    else:
                        got = self._write(conn, sid, grants, buffers[batch], deadline)
                        if receipts is not None:
                            receipts += [got[i : i + RECEIPT_BYTES] for i in range(0, len(got), RECEIPT_BYTES)]
            except _Abandoned as exc:
                self._conns.pop(ep.address, None)
                raise TransportError(
                    f"ucx {mode.name.lower()} of segment {segment.segment_id} failed: "
                    f"{exc.why}; the daemon may have stopped, or it is overloaded"
                ) from None
        return digests if mode is GrantMode.READ else None

    # -- one request -----------------------------------------------------------------------------

    def _reserve(self, count: int) -> int:
        seq = self._seq
        self._seq = (self._seq + count) & 0xFFFFFFFF
        return seq

    def _header(self, conn: Peer, op: int, sid: bytes, grants: Sequence[Grant], seq: int) -> bytearray:
        head = HEADER.pack(MAGIC, VERSION, op, len(sid), len(grants), conn.conn_id, seq)
        return bytearray(b"".join([head, sid, pack_grants(grants)]))

    def _ask(self, conn: Peer, request: bytearray, seq: int, deadline: float) -> int:
        """Send a request and wait for its first status; returns the status value or raises the
        error it carries."""
        ucx = self._worker()
        status = bytearray(STATUS_BYTES)
        received = ucx.recv(conn.ep, status, tag(conn.conn_id, seq, KIND_STATUS))
        sent = ucx.send(conn.ep, request, tag(conn.conn_id, seq, KIND_CTRL))
        self._wait(conn, [received, sent], deadline)
        return check_status(status)

    def _read(
        self, conn: Peer, sid: bytes, grants: Sequence[Grant], buffers: list[memoryview], deadline: float
    ) -> list[int]:
        """Receive into staging memory, then copy each piece to the caller's buffer (hashing it
        while it is in cache). Closing an endpoint does not stop a receive already under way: a
        daemon that hung mid-payload and resumed was seen finishing a piece after the call had
        given up. So the caller's buffers are only ever written by this copy."""
        parts = pieces(buffers)
        seq = self._reserve(2 + len(parts))
        self._ask(conn, self._header(conn, OP_READ, sid, grants, seq), seq, deadline)
        ucx = self._worker()
        staging = self._staging_for(sum(b.nbytes for b in buffers))
        staged, at = [], 0
        for _, piece in parts:
            staged.append(staging[at : at + piece.nbytes])
            at += piece.nbytes
        posted = [ucx.recv(conn.ep, stage, tag(conn.conn_id, seq + 2 + j, KIND_DATA)) for j, stage in enumerate(staged)]
        hashes = [hasher() for _ in buffers]
        copied = 0

        def copy_landed(done: int) -> None:  # pieces complete in order
            nonlocal copied
            for (owner, piece), stage in zip(parts[copied:done], staged[copied:done]):
                copy_hashing(piece, stage, hashes[owner])
            copied = done

        try:
            self._wait(conn, posted, deadline, copy_landed)
        except _Abandoned:
            self._staging = None  # stranded with the receives still posted into it
            raise
        return [h.intdigest() for h in hashes]

    def _staging_for(self, size: int) -> memoryview:
        """Staging memory for one read: kept for the next call up to _STAGING_KEPT bytes."""
        if size > _STAGING_KEPT:
            return memoryview(bytearray(size))
        if self._staging is None or len(self._staging) < size:
            self._staging = bytearray(max(size, PIECE))
        return memoryview(self._staging)

    def _write(
        self, conn: Peer, sid: bytes, grants: Sequence[Grant], buffers: list[memoryview], deadline: float
    ) -> bytes:
        """Returns the daemon's receipts, one per grant."""
        parts = pieces(buffers)
        seq = self._reserve(2 + len(parts))
        self._ask(conn, self._header(conn, OP_WRITE, sid, grants, seq), seq, deadline)
        ucx = self._worker()
        status = bytearray(status_bytes(len(grants)))
        done = ucx.recv(conn.ep, status, tag(conn.conn_id, seq + 1, KIND_STATUS))
        in_air: deque[tuple[Any, Any]] = deque()
        in_flight = 0
        for j, (_, piece) in enumerate(parts):
            while in_air and in_flight + piece.nbytes > self._window:
                self._wait(conn, [in_air[0]], deadline)
                in_flight -= in_air.popleft()[1].nbytes
            in_air.append(ucx.send(conn.ep, piece, tag(conn.conn_id, seq + 2 + j, KIND_DATA)))
            in_flight += piece.nbytes
        self._wait(conn, [*in_air, done], deadline)
        check_status(status)
        return status_payload(status)

    def _wait(
        self,
        conn: Peer,
        requests: list[tuple[Any, Any]],
        deadline: float,
        on_landed: Callable[[int], None] | None = None,
    ) -> None:
        """Progress until every request completed (on_landed(n): the first n have); then raise
        the first request's error. On the deadline, or the daemon's death, the connection is
        closed (cancelling what it had posted) and _Abandoned raised."""
        ucx = self._worker()
        done = 0
        while True:
            while done < len(requests) and requests[done][0].completed:
                done += 1
            if on_landed is not None:
                on_landed(done)
            if done == len(requests):
                break
            if ucx.progress(0):
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self._abandon(
                    conn,
                    requests,
                    f"the deadline passed with {len(requests) - done} of {len(requests)} messages pending",
                )
            if conn.local and not pid_alive(conn.pid):
                self._abandon(conn, requests, f"the daemon process {conn.pid} is gone")
            ucx.progress(max(1, min(POLL_MS, int(left * 1000))))
        for request, _ in requests:
            try:
                request.check_error()
            except Exception as exc:  # noqa: BLE001 - ucxx raises its own hierarchy
                self._abandon(conn, [], f"{type(exc).__name__}: {exc}")

    def _abandon(self, conn: Peer, requests: list[tuple[Any, Any]], why: str) -> None:
        ucx = self._worker()
        ucx.close(conn)
        for _ in range(3):  # let the cancellations complete
            ucx.progress(0)
        self._stranded += [r for r in requests if not r[0].completed]
        raise _Abandoned(why)

    def _sweep(self) -> None:
        if self._stranded:
            self._stranded = [r for r in self._stranded if not r[0].completed]

    # -- connections -----------------------------------------------------------------------------

    def _worker(self) -> Worker:
        if self._ucx is None:
            self._ucx = Worker(self._tls)
        return self._ucx

    def _connection(self, address: str, deadline: float) -> Peer:
        conn = self._conns.get(address)
        if conn is not None:
            return conn
        try:
            worker_address, host, pid = parse_address(address)
        except ValueError:
            raise TransportError(f"malformed ucx endpoint address {address[:80]!r}") from None
        ucx = self._worker()
        conn = Peer(ucx.connect(worker_address), pid, host == host_id())
        me, seq = host_id().encode(), self._reserve(1)
        hello = bytearray(
            HEADER.pack(MAGIC, VERSION, OP_HELLO, 0, 0, 0, seq)
            + HELLO.pack(os.getpid(), len(me), len(ucx.address))
            + me
            + ucx.address
        )
        try:
            conn.conn_id = self._ask(conn, hello, seq, deadline)
        except _Abandoned as exc:
            raise TransportError(
                f"cannot connect to the ucx daemon (pid {pid}): {exc.why}; check that it is running and reachable"
            ) from None
        self._conns[address] = conn
        return conn

    @property
    def connections(self) -> int:
        """Daemons this transport holds a connection to now."""
        with self._lock:
            return len(self._conns)

    def stranded_pending(self) -> int:
        """Receives that failed calls left posted into staging memory they abandoned and that have
        not completed yet. A test hook: it falls when a hung daemon resumes and its late pieces
        land, which shows they landed there (never in a caller's buffer)."""
        with self._lock:
            return sum(1 for request, _ in self._stranded if not request.completed)

    def forget(self, segment_id: str) -> None:
        """Nothing per segment: connections are per daemon, and one to a dead daemon is dropped
        at its first failure."""

    def close(self) -> None:
        """Say goodbye to every daemon (best effort) and close the connections."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
            if self._ucx is None:
                return
            ucx = self._ucx
            byes = []
            for conn in conns:
                bye = bytearray(HEADER.pack(MAGIC, VERSION, OP_BYE, 0, 0, conn.conn_id, 0))
                byes.append(ucx.send(conn.ep, bye, tag(conn.conn_id, 0, KIND_CTRL)))
            give_up = time.monotonic() + 0.2
            while not all(r.completed for r, _ in byes) and time.monotonic() < give_up:
                ucx.progress(10)
            for conn in conns:
                ucx.close(conn)
            ucx.settle(0.2)
            self._sweep()
            if self._stranded or ucx.closing:  # a request still points into buffers: keep all
                _STRANDED.append((ucx, self._stranded))
            self._ucx, self._stranded = None, []
