"""The daemon side of the `ucx` transport (the protocol is described in ucx_client.py): one UCX worker
driven by one thread, which also runs every request."""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvstore.config import DEFAULT_UCX_TLS, DaemonConfig
from kvstore.errors import ErrorCode, KVStoreError, TransportError
from kvstore.grant import unpack_grants
from kvstore.hostid import host_id, pid_alive
from kvstore.storage.base import Landing, SegmentStorage
from kvstore.transport.base import GrantChecker, TransportServer
from kvstore.transport.ucx_wire import (
    HEADER,
    HELLO,
    ITEM,
    KIND_CTRL,
    KIND_DATA,
    KIND_STATUS,
    MAGIC,
    MAX_CTRL_BYTES,
    MAX_ITEMS,
    MAX_SEGMENT_ID_BYTES,
    OP_BYE,
    OP_HELLO,
    OP_READ,
    OP_WRITE,
    POLL_MS,
    VERSION,
    Peer,
    Worker,
    encode_status,
    pieces,
    tag,
    window,
)
from kvstore.types import Endpoint, Grant, GrantMode

_BATCH_TIMEOUT_S = 30.0  # a request not finished by then drops its client
_REAP_EVERY_S = 1.0  # how often to look for dead same-host clients
_log = logging.getLogger(__name__)


@dataclass
class _Batch:
    """A request in progress on the daemon: requests in flight, pieces still to send (READ), and
    what to do once all complete (WRITE: store bounced pieces, send the final status)."""

    conn_id: int  # 0: a reply to a hello
    deadline: float
    requests: list[tuple[Any, Any]] = field(default_factory=list)
    to_send: deque[tuple[memoryview, int]] = field(default_factory=deque)
    then: Callable[[list[tuple[Any, Any]]], None] | None = None


class UcxServer(TransportServer):
    """One worker, progressed by one thread that also runs every request; serves every segment
    (through bounce buffers where a segment has no view)."""

    name = "ucx"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._checker = checker
        self._tls = config.ucx_tls or DEFAULT_UCX_TLS
        self._window = window(self._tls)
        self._ucx: Worker | None = None
        self._address = ""
        self._clients: dict[int, Peer] = {}
        self._batches: list[_Batch] = []
        self._next_id = 0
        self._ctrl: tuple[Any, Any] | None = None
        self._ctrl_buf = bytearray(MAX_CTRL_BYTES)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._ready = threading.Event()

    @property
    def _w(self) -> Worker:
        """The worker (made by the loop's thread before anything else runs on it)."""
        assert self._ucx is not None, "the ucx loop is not running"
        return self._ucx

    @property
    def connections(self) -> int:
        """Clients connected now (each said HELLO and has not said BYE nor been dropped)."""
        return len(self._clients)

    def start(self) -> None:
        """Start the worker and its thread; returns once the worker address is known."""
        self._thread = threading.Thread(target=self._run, name="kvstore-ucx", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        return Endpoint(self.name, self._address) if self._address else None

    def stop(self) -> None:
        """End the loop; it closes every client's endpoint on its way out (at most ~5 s)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5.0)

    # -- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._ucx = Worker(self._tls)
            self._address = f"{self._w.address.hex()}|{host_id()}|{os.getpid()}"
            self._post_ctrl()
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._failed = (
                exc
                if isinstance(exc, KVStoreError)
                else TransportError(f"ucx transport cannot start (UCX_TLS={self._tls}): {exc}")
            )
            self._ready.set()
            return
        self._ready.set()
        reaped = time.monotonic()
        try:
            while not self._stopping.is_set():
                try:
                    self._w.progress(POLL_MS)
                    while self._posted_ctrl().completed:
                        self._on_ctrl()
                    self._advance()
                    if time.monotonic() - reaped > _REAP_EVERY_S:
                        reaped = time.monotonic()
                        self._reap_dead_clients()
                except Exception:  # noqa: BLE001 - a bug: keep serving the other clients
                    _log.exception("ucx: the daemon's loop failed; it carries on")
                    self._stopping.wait(0.1)
        finally:
            for client in self._clients.values():
                self._w.close(client)
            self._clients.clear()
            self._batches.clear()
            self._w.settle(0.5)

    def _post_ctrl(self) -> None:
        """Receive the next request from any client (CTRL is the low byte of the tag)."""
        ucx = self._w
        arr = ucx.Array(self._ctrl_buf)
        self._ctrl = ucx.worker.tag_recv(arr, ucx.L.UCXXTag(KIND_CTRL), ucx.L.UCXXTagMask(0xFF)), arr

    def _posted_ctrl(self) -> Any:
        assert self._ctrl is not None, "no control receive posted"
        return self._ctrl[0]

    def _on_ctrl(self) -> None:
        try:
            self._posted_ctrl().check_error()
        except Exception as exc:  # noqa: BLE001 - e.g. truncated: over MAX_CTRL_BYTES
            _log.warning("ucx: dropped a malformed request (%s)", exc)
        else:
            self._handle(memoryview(self._ctrl_buf))
        self._post_ctrl()

    def _handle(self, message: memoryview) -> None:
        """Act on one request; nothing of `message` is kept (its buffer is reused)."""
        magic, version, op, id_len, count, conn_id, seq = HEADER.unpack_from(message)
        if magic != MAGIC or version != VERSION:
            _log.warning("ucx: dropped a request with magic %r version %d", magic, version)
            return
        if op == OP_HELLO:
            self._hello(message, seq)
            return
        if conn_id not in self._clients:
            _log.info("ucx: request from unknown connection %d (dropped earlier?): ignored", conn_id)
            return
        if op == OP_BYE:
            self._drop(conn_id)
            return
        try:
            self._serve(message, op, id_len, count, conn_id, seq)
        except Exception as exc:  # noqa: BLE001 - UCX failed on this client's endpoint
            _log.warning("ucx: serving connection %d failed (%s: %s); dropping it", conn_id, type(exc).__name__, exc)
            self._drop(conn_id)

    def _serve(self, message: memoryview, op: int, id_len: int, count: int, conn_id: int, seq: int) -> None:
        """Check a READ or WRITE request's grants, then start it or refuse it."""
        if op not in (OP_READ, OP_WRITE) or not 0 < id_len <= MAX_SEGMENT_ID_BYTES or count > MAX_ITEMS:
            self._send_status(
                conn_id,
                seq,
                encode_status(
                    ErrorCode.INVALID_ARGUMENT,
                    f"malformed ucx request: op {op}, segment id of {id_len} bytes, {count} items",
                ),
            )
            return
        mode = GrantMode.READ if op == OP_READ else GrantMode.WRITE
        try:
            segment_id = bytes(message[HEADER.size : HEADER.size + id_len]).decode()
            table = message[HEADER.size + id_len : HEADER.size + id_len + count * ITEM.size]
            grants = unpack_grants(segment_id, table)
            # Derived before the check, so the time the check takes comes out of the batch's time.
            deadline = min(time.monotonic() + _BATCH_TIMEOUT_S, self._checker.deadline(grants))
            placed = list(zip(self._checker.check_all(grants, mode), grants, strict=True))
        except (KVStoreError, ValueError, struct.error) as exc:  # ValueError: bad UTF-8 or mode
            code = getattr(exc, "code", ErrorCode.INVALID_ARGUMENT)
            self._send_status(conn_id, seq, encode_status(code, str(exc)))
            return
        # Counted when started: requests complete asynchronously on the worker, so they are not timed.
        self.observer.transferred(self.name, mode, sum(g.length for g in grants), None)
        if mode is GrantMode.READ:
            self._serve_read(conn_id, seq, placed, deadline)
        else:
            self._serve_write(conn_id, seq, placed, deadline)

    def _hello(self, message: memoryview, seq: int) -> None:
        """A new client: make an endpoint back to its worker and tell it its connection id."""
        try:
            pid, host_len, address_len = HELLO.unpack_from(message, HEADER.size)
            start = HEADER.size + HELLO.size
            host = bytes(message[start : start + host_len]).decode()
            ep = self._w.connect(bytes(message[start + host_len : start + host_len + address_len]))
        except Exception as exc:  # noqa: BLE001 - a bad address: nowhere to answer
            _log.warning("ucx: dropped a malformed hello (%s)", exc)
            return
        while True:
            self._next_id = self._next_id % 0xFFFFFF + 1
            if self._next_id not in self._clients:
                break
        self._clients[self._next_id] = Peer(ep, pid, host == host_id())
        try:
            self._send_status(0, seq, encode_status(ErrorCode.OK, value=self._next_id), ep)
        except Exception as exc:  # noqa: BLE001 - UCX failed on the new endpoint
            _log.warning("ucx: answering a hello failed (%s); dropping the client", exc)
            self._drop(self._next_id)

    def _serve_read(self, conn_id: int, seq: int, placed: list[tuple[SegmentStorage, Grant]], deadline: float) -> None:
        """Answer OK, then queue the pieces; _advance sends them within the window."""
        sources = []
        try:
            for segment, g in placed:
                sources.append(segment.readable(g.offset, g.length))
        except (OSError, ValueError) as exc:
            self._send_status(
                conn_id, seq, encode_status(ErrorCode.INTERNAL, f"loading the requested bytes failed: {exc}")
            )
            return
        self._send_status(conn_id, seq, encode_status(ErrorCode.OK))
        # Pieces sent after the grants expire could carry another key's bytes: the client is
        # dropped at the first grant's expiry (or the batch timeout, if sooner).
        batch = _Batch(conn_id, deadline)
        batch.to_send.extend(
            (piece, tag(conn_id, seq + 2 + j, KIND_DATA)) for j, (_, piece) in enumerate(pieces(sources))
        )
        self._batches.append(batch)

    def _serve_write(self, conn_id: int, seq: int, placed: list[tuple[SegmentStorage, Grant]], deadline: float) -> None:
        """Post a receive per piece, straight into segment memory, then answer OK; once all landed
        (see _advance), store the bounced ones and send the final status."""
        # Receives armed in segment memory must not outlive the grants: the space may be handed
        # to another key once a write grant expires.
        batch = _Batch(conn_id, deadline)
        landing = Landing((segment, g.offset, g.length) for segment, g in placed)
        ep = self._clients[conn_id].ep
        batch.requests = [
            self._w.recv(ep, piece, tag(conn_id, seq + 2 + j, KIND_DATA))
            for j, (_, piece) in enumerate(pieces(landing.views))
        ]

        def store(requests: list[tuple[Any, Any]]) -> None:
            try:
                for request, _ in requests:
                    request.check_error()
                landing.finish()
                # The OK of a write carries a receipt per grant, for the writer's PutEnd.
                status = encode_status(ErrorCode.OK, b"".join(self._checker.receipt(g) for _, g in placed))
            except Exception as exc:  # noqa: BLE001 - reported to the client
                status = encode_status(ErrorCode.INTERNAL, f"storing the written bytes failed: {exc}")
            self._send_status(conn_id, seq + 1, status)

        batch.then = store
        self._batches.append(batch)
        self._send_status(conn_id, seq, encode_status(ErrorCode.OK))

    def _send_status(self, conn_id: int, seq: int, status: bytearray, ep: Any = None) -> None:
        if ep is None:
            client = self._clients.get(conn_id)
            if client is None:
                return
            ep = client.ep
        self._batches.append(
            _Batch(
                conn_id,
                time.monotonic() + _BATCH_TIMEOUT_S,
                requests=[self._w.send(ep, status, tag(conn_id, seq, KIND_STATUS))],
            )
        )

    def _advance(self) -> None:
        """Move every batch on: send more pieces within the window, finish those whose requests
        all completed, drop clients whose batch ran out of time."""
        batches, self._batches = self._batches, []  # finishing one may start another
        now, still, expired = time.monotonic(), [], set()
        for batch in batches:
            client = self._clients.get(batch.conn_id)
            if batch.conn_id and client is None:
                continue  # its client was dropped
            try:
                if self._step(batch, client):
                    continue
            except Exception as exc:  # noqa: BLE001 - UCX failed on this client
                _log.warning(
                    "ucx: a transfer with connection %d failed (%s: %s)", batch.conn_id, type(exc).__name__, exc
                )
                expired.add(batch.conn_id)
                continue
            if now > batch.deadline:
                _log.warning("ucx: connection %d stalled mid-request", batch.conn_id)
                expired.add(batch.conn_id)
            else:
                still.append(batch)
        self._batches = still + self._batches
        for conn_id in expired:
            self._drop(conn_id)

    def _step(self, batch: _Batch, client: Peer | None) -> bool:
        """Send more of a read's pieces, within the window; True once the batch is finished."""
        if batch.to_send:  # completed sends need no more care
            batch.requests = [r for r in batch.requests if not r[0].completed]
            in_flight = sum(arr.nbytes for _, arr in batch.requests)
            while batch.to_send and (not batch.requests or in_flight + batch.to_send[0][0].nbytes <= self._window):
                piece, tag_ = batch.to_send.popleft()
                assert client is not None, "a read's batch belongs to a client"
                batch.requests.append(self._w.send(client.ep, piece, tag_))
                in_flight += piece.nbytes
        if batch.to_send or not all(r[0].completed for r in batch.requests):
            return False
        if batch.then is not None:
            batch.then(batch.requests)
        return True

    def _drop(self, conn_id: int) -> None:
        """Forget a client and close its endpoint, cancelling the receives posted for it into
        segment memory that have not started."""
        client = self._clients.pop(conn_id, None)
        if client is not None:
            try:
                self._w.close(client)
            except Exception as exc:  # noqa: BLE001 - nothing more to do for it
                _log.warning("ucx: closing connection %d failed: %s", conn_id, exc)
        self._batches = [b for b in self._batches if b.conn_id != conn_id]

    def _reap_dead_clients(self) -> None:
        for conn_id, client in list(self._clients.items()):
            if client.local and not pid_alive(client.pid):
                self._drop(conn_id)
