"""The client side of the `tcp` transport (the wire format is described in tcp_wire.py)."""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any

from kvstore.checksum import PIECE
from kvstore.clock import Clock
from kvstore.config import ClientConfig
from kvstore.errors import KVStoreError, TransportError
from kvstore.transport.base import Transfer, Transport, Written, checked_view
from kvstore.transport.tcp_wire import (
    MAX_ITEMS,
    RECEIPT,
    encode_request,
    read_reply,
    recv_buffers,
    recv_exact,
    recv_hashed,
    send_buffers,
    tune,
)
from kvstore.types import GrantMode, SegmentInfo

_MAX_IDLE_PER_ADDRESS = 16


def _send_write(sock: socket.socket, request: bytes, buffers: list[memoryview], deadline: float, address: str) -> None:
    try:
        send_buffers(sock, [request, *buffers], deadline)
    except OSError as exc:
        # The daemon may have refused a grant and closed before taking the payload; its error
        # reply, if one arrived, says why.
        try:
            read_reply(sock, deadline, address)
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
        raise TransportError(
            f"cannot connect to the tcp daemon at {address}: {exc}; check that the "
            "daemon is running and its port is reachable"
        ) from exc
    sock.settimeout(None)
    tune(sock)
    return sock


def _still_idle(sock: socket.socket) -> bool:
    """Whether a pooled connection is open with nothing unread (else the daemon closed it)."""
    if isinstance(sock, ssl.SSLSocket):  # no MSG_PEEK through TLS: readable means closed
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not sock.pending() and not poller.poll(0)
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

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        """The daemon answers with a receipt per grant (for PutEnd)."""
        receipts: list[bytes] = []
        for buffers, request in self._requests(segment, transfers, GrantMode.WRITE):
            address = self._address(segment)
            reply = self._exchange(address, GrantMode.WRITE, request, buffers, deadline)
            receipts += [bytes(reply[i : i + RECEIPT]) for i in range(0, len(reply), RECEIPT)]
        return Written(None, receipts)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        """Reads of large blocks come back with their checksums, hashed as each piece arrived."""
        requests = self._requests(segment, transfers, GrantMode.READ)
        hashed = sum(b.nbytes for bufs, _ in requests for b in bufs) >= len(transfers) * PIECE
        digests: list[int] = []
        for buffers, request in requests:
            digests += self._exchange(self._address(segment), GrantMode.READ, request, buffers, deadline, hashed)
        return digests if hashed else None

    def ping(self, segment: SegmentInfo, deadline: float) -> float:
        """Seconds for one empty request to the segment's daemon and its reply (the link
        monitor's active probe); TransportError if the daemon does not answer."""
        begun = time.perf_counter()
        empty = encode_request(segment.segment_id, GrantMode.READ, [])
        self._exchange(self._address(segment), GrantMode.READ, empty, [], deadline)
        return time.perf_counter() - begun

    def _address(self, segment: SegmentInfo) -> str:
        ep = segment.endpoint(self.name)
        if ep is None:
            raise TransportError(f"segment {segment.segment_id} offers no {self.name} endpoint")
        return ep.address

    def _requests(
        self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode
    ) -> list[tuple[list[memoryview], bytes]]:
        """The call as requests of at most MAX_ITEMS grants: each one's buffers and encoding."""
        now = self.now_ms()
        buffers = [checked_view(segment, t, mode, self.name, now) for t in transfers]
        return [
            (
                buffers[i : i + MAX_ITEMS],
                encode_request(segment.segment_id, mode, [t.grant for t in transfers[i : i + MAX_ITEMS]]),
            )
            for i in range(0, len(transfers), MAX_ITEMS)
        ]

    def _exchange(
        self,
        address: str,
        mode: GrantMode,
        request: bytes,
        buffers: list[memoryview],
        deadline: float,
        hashed: bool = False,
    ) -> Any:
        """One request and its reply on a pooled connection. A write returns its receipts; a read
        with `hashed`, the buffers' checksums (else nothing)."""
        sock = self._checkout(address, deadline)
        keep = False
        out: Any = []
        try:
            if mode is GrantMode.WRITE:
                _send_write(sock, request, buffers, deadline, address)
            else:
                send_buffers(sock, [request], deadline)
            read_reply(sock, deadline, address)
            if mode is GrantMode.WRITE:
                out = recv_exact(sock, RECEIPT * len(buffers), deadline)
            elif hashed:
                out = recv_hashed(sock, buffers, deadline)
            else:
                recv_buffers(sock, buffers, deadline)
            keep = True
        except KVStoreError as exc:  # a refused read leaves the stream in sync; a write does not
            keep = mode is GrantMode.READ and not isinstance(exc, TransportError)
            raise
        except OSError as exc:
            what = "the deadline passed" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            raise TransportError(
                f"{self.name} transfer with the daemon at {address} failed: {what}; the daemon "
                "may have stopped, or it or the network is overloaded"
            ) from exc
        finally:
            if keep:
                self._checkin(address, sock)
            else:
                sock.close()
        return out

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
        # A connect gets connect_timeout_s at most: an unreachable daemon must not take the time of
        # the transfers to the others behind it in the same call.
        return self._dial(address, min(deadline, time.monotonic() + self.config.connect_timeout_s))

    def idle(self, address: str) -> int:
        """Connections to the daemon at `address` pooled for the next call now (a test hook: a
        batch must reuse one connection, not dial one per block)."""
        with self._lock:
            return len(self._idle.get(address, []))

    def _dial(self, address: str, deadline: float) -> socket.socket:
        """A new connection to the daemon at `address` (the tls transport's speaks TLS)."""
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
