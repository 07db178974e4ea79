"""`inproc`: the reference transport, for a client and a daemon in one process.

The client hands its buffers straight to the daemon-side server: no socket, no file, one copy
into or out of the segment. The server still checks every grant with the daemon's GrantChecker
(and so kvstore/grant.py's one check), takes a write grant once and answers with a receipt, as a
network transport does; behavioural tests of the whole store therefore run over it in
milliseconds, without processes, under the same grant rules as tcp.

Endpoint address: "<host id>|<pid>|<server number>". A client reaches only servers of its own
process that are serving now; a stopped server's segments fail with TransportError.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

from kvstore.checksum import checksum, copy_with_checksum
from kvstore.config import DaemonConfig
from kvstore.errors import TransportError
from kvstore.hostid import host_id
from kvstore.storage.base import SegmentStorage
from kvstore.transport.base import GrantChecker, Transfer, Transport, TransportServer, Written, checked_view
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo

# Servers of this process by number. A number is never reused, so an endpoint of a stopped server
# cannot reach a later one.
_SERVING: dict[int, InprocServer] = {}
_NUMBERS = itertools.count(1)
_LOCK = threading.Lock()


class Moved(NamedTuple):
    """What a server returns for one request: per grant, the checksum of the bytes moved, and for
    a write the receipt of each grant (None for a read)."""

    checksums: list[int]
    receipts: list[bytes] | None


def _parse(address: str) -> tuple[str, int, int]:
    host, pid, number = address.split("|", 2)
    return host, int(pid), int(number)


class InprocServer(TransportServer):
    """Daemon side. Thread safe: requests run on their callers' threads."""

    name = "inproc"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._checker = checker
        self.number = next(_NUMBERS)

    def start(self) -> None:
        with _LOCK:
            _SERVING[self.number] = self

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        return Endpoint(self.name, f"{host_id()}|{os.getpid()}|{self.number}")

    def stop(self) -> None:
        with _LOCK:
            _SERVING.pop(self.number, None)

    def move(self, grants: Sequence[Grant], buffers: Sequence[memoryview], mode: GrantMode) -> Moved:
        """Copy each buffer into (WRITE) or out of (READ) its grant's range, after checking every
        grant (PermissionDenied, and nothing moved, if one fails; a WRITE takes its grants).
        TransportError if a tier refuses the range (then any subset may have moved)."""
        segments = self._checker.check_all(grants, mode)
        nbytes = sum(g.length for g in grants)
        self.observer.admit(self.name, mode, nbytes)
        begun = time.perf_counter()
        try:
            digests = [_copy(seg, g.offset, buf, mode) for seg, g, buf in zip(segments, grants, buffers, strict=True)]
        except (ValueError, OSError) as exc:
            raise TransportError(f"inproc {mode.name.lower()} failed in the daemon: {exc}") from exc
        self.observer.transferred(self.name, mode, nbytes, time.perf_counter() - begun)
        receipts = [self._checker.receipt(g) for g in grants] if mode is GrantMode.WRITE else None
        return Moved(digests, receipts)


def _copy(segment: SegmentStorage, offset: int, buffer: memoryview, mode: GrantMode) -> int:
    """The checksum of the bytes moved between `buffer` and the segment at `offset`."""
    view = segment.view(offset, len(buffer))
    if view is not None:
        return copy_with_checksum(view, buffer) if mode is GrantMode.WRITE else copy_with_checksum(buffer, view)
    if mode is GrantMode.WRITE:  # tiers without a view copy from the caller's buffer themselves
        segment.write_from(offset, buffer)
    else:
        segment.read_into(offset, buffer)
    return checksum(buffer)


class InprocTransport(Transport):
    """Client side: stateless beyond the process's table of servers."""

    name = "inproc"

    def can_reach(self, segment: SegmentInfo) -> bool:
        return self._server(segment) is not None

    def _server(self, segment: SegmentInfo) -> InprocServer | None:
        parsed = self.address_of(segment, _parse)
        if parsed is None or parsed[:2] != (host_id(), os.getpid()):
            return None
        with _LOCK:
            return _SERVING.get(parsed[2])

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode) -> Moved:
        now = self.now_ms()
        buffers = [checked_view(segment, t, mode, self.name, now) for t in transfers]
        server = self._server(segment)
        if server is None:
            raise TransportError(f"segment {segment.segment_id} is not served by a daemon in this process (stopped?)")
        return server.move([t.grant for t in transfers], buffers, mode)

    # Copies run on the caller's thread and cannot stall on a peer, so `deadline` is not consulted.
    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        moved = self._move(segment, transfers, GrantMode.WRITE)
        return Written(moved.checksums, moved.receipts)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.READ).checksums
