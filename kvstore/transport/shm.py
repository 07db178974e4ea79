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
from dataclasses import dataclass
from typing import Sequence

from kvstore.checksum import copy_with_checksum, hasher
from kvstore.config import DaemonConfig
from kvstore.errors import InvalidArgument, PermissionDenied, TransportError
from kvstore.hostid import host_id, pid_alive
from kvstore.storage.base import SegmentStorage
from kvstore.transport.base import GrantChecker, Transfer, Transport, TransportServer
from kvstore.types import Endpoint, GrantMode, SegmentInfo, Tier


_PIECE = 1 << 20


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

    def move(self, offset: int, buffer: memoryview, mode: GrantMode) -> int:
        """Copy between the segment and `buffer`; returns the checksum of the bytes moved."""
        if self.view is not None:
            remote = self.view[offset:offset + len(buffer)]
            if mode is GrantMode.WRITE:
                return copy_with_checksum(remote, buffer)
            return copy_with_checksum(buffer, remote)
        h = hasher()
        for start in range(0, len(buffer), _PIECE):     # hash each piece while it is in cache
            piece = buffer[start:start + _PIECE]
            if mode is GrantMode.WRITE:
                h.update(piece)
            done = 0
            while done < len(piece):
                n = os.pwrite(self.fd, piece[done:], offset + start + done) if mode is GrantMode.WRITE \
                    else os.preadv(self.fd, [piece[done:]], offset + start + done)
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
                self.mm.close()
        except BufferError:
            pass   # a caller still holds a slice; the mapping is freed with it
        if self.fd >= 0:
            os.close(self.fd)


class ShmTransport(Transport):
    name = "shm"

    def __init__(self) -> None:
        self._open: dict[str, _Opened] = {}
        self._lock = threading.Lock()

    def can_reach(self, segment: SegmentInfo) -> bool:
        ep = segment.endpoint(self.name)
        if ep is None:
            return False
        host, pid, path = _parse(ep.address)
        return host == host_id() and pid_alive(pid) and os.path.exists(path)

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
            raise TransportError(f"cannot open segment {segment.segment_id} at {path}: {exc}; "
                                 "its daemon may have stopped") from exc

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode) -> list[int]:
        opened = self._opened(segment)
        now_ms = int(time.time() * 1000)
        digests = []
        for t in transfers:
            g = t.grant
            if g.segment_id != segment.segment_id or g.mode != mode:
                raise InvalidArgument(f"grant for {g.segment_id}/{g.mode.name} used for "
                                      f"{segment.segment_id}/{mode.name}")
            if g.expires_ms < now_ms:
                # The space may already belong to another key: writing now could corrupt it, and
                # reading could return its bytes.
                raise PermissionDenied(f"{mode.name.lower()} grant expired {now_ms - g.expires_ms} ms ago: "
                                       f"{'put' if mode is GrantMode.WRITE else 'get'} again")
            if len(t.buffer) != g.length or g.offset + g.length > segment.capacity:
                raise InvalidArgument(f"buffer of {len(t.buffer)} bytes does not match grant "
                                      f"[{g.offset}, +{g.length}) in a {segment.capacity}-byte segment")
            try:
                digests.append(opened.move(g.offset, t.buffer, mode))
            except OSError as exc:
                raise TransportError(f"shm {mode.name.lower()} of segment {segment.segment_id} failed: {exc}") from exc
        return digests

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.WRITE)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.READ)

    def forget(self, segment_id: str) -> None:
        with self._lock:
            entry = self._open.pop(segment_id, None)
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
        path = getattr(segment, "path", None)
        if path is None or segment.tier not in (Tier.DRAM, Tier.SSD):
            return None
        return Endpoint(self.name, f"{host_id()}|{os.getpid()}|{path}")

    def stop(self) -> None:
        pass
