"""`shm`: same-host transport straight to the daemon's segment files.

DRAM segments are files in /dev/shm: the client maps them and copies with one memcpy. SSD
segments are files on local disk: the client preads straight into its buffer (and pwrites). The
daemon does nothing per request.

Trust boundary: the daemon cannot check grants here, so any process of the daemon's user that can
open the files (mode 0600) can touch whole segments. The client still confines itself to granted
ranges, refuses expired grants, and refuses a segment whose daemon process has died.

Endpoint address: "<host_id>|<daemon pid>|<path>".
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.checksum import PIECE, copy_with_checksum, hasher
from kvstore.clock import Clock
from kvstore.config import ClientConfig, DaemonConfig
from kvstore.errors import InvalidArgument, TransportError
from kvstore.hostid import host_id, pid_alive
from kvstore.storage.base import FileBacked, SegmentStorage
from kvstore.transport.base import (
    GrantChecker,
    Transfer,
    Transport,
    TransportServer,
    Written,
    check_grant,
    checked_view,
)
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo, Tier

REACH_S = 1.0  # how long a segment's reachability is remembered
# A mapping's pages fault into this process one at a time (a read fault maps 16 around it) on first
# touch: a first read of a 1 MiB block ran at a third of a second one. madvise(MADV_POPULATE_*)
# (Linux 5.14) maps a transfer's whole range in one call first; nothing is paid up front for the
# segment (MAP_POPULATE costs ~0.1 s per GiB at each client's first use of a segment). Each page is
# populated once per mapping (`_Opened.mapped`): a range already mapped is not asked for again
# (8 us per MiB even when there is nothing to do). A page the daemon later gives back to the
# kernel simply faults in again.
POPULATE_MIN = 256 << 10
MADV_POPULATE = {GrantMode.READ: 22, GrantMode.WRITE: 23}  # MADV_POPULATE_READ / _WRITE
_PAGE = mmap.PAGESIZE


def _parse(address: str) -> tuple[str, int, str]:
    host, pid, path = address.split("|", 2)
    return host, int(pid), path


@dataclass
class _Opened:
    """A segment file as the client holds it: mapped (DRAM) or an open fd (SSD)."""

    pid: int
    fd: int = -1
    mm: mmap.mmap | None = None
    view: memoryview | None = None
    populate: bool = True  # False once the kernel refused MADV_POPULATE_* (before 5.14)
    # Per page of the mapping: 0 not populated, 1 populated for reading, 2 for writing (and reading).
    mapped: bytearray | None = None

    def populate_range(self, offset: int, length: int, mode: GrantMode) -> None:
        """Map [offset, +length) into this process as `mode` needs it, unless it is already."""
        assert self.mm is not None
        if self.mapped is None:
            self.mapped = bytearray(-(-len(self.mm) // _PAGE))
        first, end = offset // _PAGE, -(-(offset + length) // _PAGE)
        need = 2 if mode is GrantMode.WRITE else 1
        pages = self.mapped[first:end]
        if pages.count(b"\0") == 0 and (need == 1 or pages.count(b"\1") == 0):
            return  # all mapped already, as this transfer needs them
        start = first * _PAGE
        try:
            self.mm.madvise(MADV_POPULATE[mode], start, min(end * _PAGE, len(self.mm)) - start)
        except OSError:
            self.populate = False  # the pages still fault in on touch, as without it
            return
        self.mapped[first:end] = bytes([need]) * (end - first) if need == 2 else pages.replace(b"\0", b"\1")

    def move(self, offset: int, buffer: memoryview, mode: GrantMode) -> int:
        """Copy between the segment and `buffer`; returns the checksum of the bytes moved."""
        if self.view is not None:
            prepare = None
            if len(buffer) >= POPULATE_MIN and self.populate:
                # Run before each piece's copy: for a large copy, on the helper thread, ahead of it.
                def prepare(start: int, length: int) -> None:
                    self.populate_range(offset + start, length, mode)

            remote = self.view[offset : offset + len(buffer)]
            if mode is GrantMode.WRITE:
                return copy_with_checksum(remote, buffer, prepare)
            return copy_with_checksum(buffer, remote, prepare)
        h = hasher()
        for start in range(0, len(buffer), PIECE):  # hash each piece while it is in cache
            piece = buffer[start : start + PIECE]
            if mode is GrantMode.WRITE:
                h.update(piece)
            done = 0
            while done < len(piece):
                n = (
                    os.pwrite(self.fd, piece[done:], offset + start + done)
                    if mode is GrantMode.WRITE
                    else os.preadv(self.fd, [piece[done:]], offset + start + done)
                )
                if n <= 0:
                    raise OSError(f"short {mode.name.lower()} at {offset + start + done}")
                done += n
            if mode is GrantMode.READ:
                h.update(piece)
        return h.intdigest()

    def close(self) -> None:
        try:
            if self.view is not None:
                self.view.release()
            if self.mm is not None:
                self.mm.close()
        except BufferError:
            pass  # a caller still holds a slice; the mapping is freed with it
        if self.fd >= 0:
            os.close(self.fd)


class ShmTransport(Transport):
    name = "shm"

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._open: dict[str, _Opened] = {}
        self._reach: dict[str, tuple[bool, float]] = {}  # segment id -> (reachable, until: monotonic)
        self._lock = threading.Lock()

    def can_reach(self, segment: SegmentInfo) -> bool:
        """Same host, daemon alive, file present; remembered for REACH_S (a read checks the
        daemon's pid itself)."""
        now = time.monotonic()
        known = self._reach.get(segment.segment_id)
        if known is not None and known[1] > now:
            return known[0]
        fields = self.address_of(segment, _parse)
        reachable = False
        if fields is not None:
            host, pid, path = fields
            reachable = host == host_id() and pid_alive(pid) and os.path.exists(path)
        if len(self._reach) > 4096:
            self._reach.clear()
        self._reach[segment.segment_id] = (reachable, now + REACH_S)
        return reachable

    def _opened(self, segment: SegmentInfo) -> _Opened:
        with self._lock:
            entry = self._open.get(segment.segment_id)
            if entry is None:
                entry = self._open[segment.segment_id] = self._open_file(segment)
        if not pid_alive(entry.pid):
            self.forget(segment.segment_id)
            raise TransportError(f"daemon (pid {entry.pid}) of segment {segment.segment_id} is gone")
        return entry

    def _open_file(self, segment: SegmentInfo) -> _Opened:
        ep = segment.endpoint(self.name)
        if ep is None:
            raise TransportError(f"segment {segment.segment_id} offers no shm endpoint")
        _, pid, path = _parse(ep.address)
        try:
            fd = os.open(path, os.O_RDWR)
            if segment.tier is Tier.SSD:
                return _Opened(pid, fd=fd)
            try:
                # Not MAP_POPULATE: it costs ~1 s per GiB up front; pages fault in once, on first use.
                mm = mmap.mmap(fd, segment.capacity, mmap.MAP_SHARED)
            finally:
                os.close(fd)
            return _Opened(pid, mm=mm, view=memoryview(mm))
        except (OSError, ValueError) as exc:
            raise TransportError(
                f"cannot open segment {segment.segment_id} at {path}: {exc}; its daemon may have stopped"
            ) from exc

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode) -> list[int]:
        opened = self._opened(segment)
        now = self.now_ms()
        digests = []
        for t in transfers:
            buffer = checked_view(segment, t, mode, self.name, now)
            try:
                digests.append(opened.move(t.grant.offset, buffer, mode))
            except OSError as exc:
                raise TransportError(f"shm {mode.name.lower()} of segment {segment.segment_id} failed: {exc}") from exc
        return digests

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        return Written(self._move(segment, transfers, GrantMode.WRITE), None)

    def write_pieces(
        self, segment: SegmentInfo, grant: Grant, pieces: Sequence[tuple[int, memoryview]], deadline: float
    ) -> Written:
        """The grant is checked once; each piece only for lying inside it (a batch of small values
        costs no grant and no transfer object per value)."""
        check_grant(segment, grant, GrantMode.WRITE, self.now_ms())
        opened = self._opened(segment)
        lo, hi = grant.offset, grant.offset + grant.length
        if opened.view is not None and opened.populate and pieces:
            # The batch's pages mapped in one call, not a fault each at its first copy.
            start = max(lo, min(o for o, _ in pieces))
            end = min(hi, max(o + b.nbytes for o, b in pieces))
            if end > start:
                opened.populate_range(start, end - start, GrantMode.WRITE)
        digests = []
        for offset, buffer in pieces:
            if offset < lo or offset + buffer.nbytes > hi or not buffer.c_contiguous:
                raise InvalidArgument(
                    f"a piece [{offset}, +{buffer.nbytes}) is outside its grant [{lo}, +{grant.length}), "
                    "or its buffer is not C-contiguous"
                )
            try:
                digests.append(opened.move(offset, buffer.cast("B"), GrantMode.WRITE))
            except OSError as exc:
                raise TransportError(f"shm write of segment {segment.segment_id} failed: {exc}") from exc
        return Written(digests, None)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.READ)

    def forget(self, segment_id: str) -> None:
        with self._lock:
            entry = self._open.pop(segment_id, None)
            self._reach.pop(segment_id, None)
        if entry is not None:
            entry.close()

    def close(self) -> None:
        for segment_id in list(self._open):
            self.forget(segment_id)


class ShmServer(TransportServer):
    """Nothing to serve: advertising the segment files is the whole job."""

    name = "shm"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        pass

    def start(self) -> None:
        pass

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        if not isinstance(segment, FileBacked) or segment.tier not in (Tier.DRAM, Tier.SSD):
            return None
        return Endpoint(self.name, f"{host_id()}|{os.getpid()}|{segment.path}")

    def stop(self) -> None:
        pass
