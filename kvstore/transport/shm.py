"""`shm`: same-host transport over the DRAM segment files in /dev/shm.

The client maps the daemon's segment file and copies with one memcpy; the daemon does nothing per
request. Trust boundary: the daemon cannot check grants here, so any process of the daemon's user
that can open the file (mode 0600) can touch the whole segment. The client still confines itself
to granted ranges, and refuses a segment whose daemon process has died.

Endpoint address: "<host_id>|<daemon pid>|<path>".
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Sequence

from kvstore.errors import InvalidArgument, PermissionDenied, TransportError
from kvstore.hostid import host_id, pid_alive
from kvstore.storage.base import SegmentStorage
from kvstore.storage.dram import DramSegment
from kvstore.config import DaemonConfig
from kvstore.transport.base import GrantChecker, Transfer, Transport, TransportServer
from kvstore.types import Endpoint, GrantMode, SegmentInfo


def _parse(address: str) -> tuple[str, int, str]:
    host, pid, path = address.split("|", 2)
    return host, int(pid), path


class ShmTransport(Transport):
    name = "shm"

    def __init__(self) -> None:
        self._maps: dict[str, tuple[mmap.mmap, memoryview, int]] = {}
        self._lock = threading.Lock()

    def can_reach(self, segment: SegmentInfo) -> bool:
        ep = segment.endpoint(self.name)
        if ep is None:
            return False
        host, pid, path = _parse(ep.address)
        return host == host_id() and pid_alive(pid) and os.path.exists(path)

    def _segment_view(self, segment: SegmentInfo) -> memoryview:
        with self._lock:
            entry = self._maps.get(segment.segment_id)
            if entry is None:
                ep = segment.endpoint(self.name)
                if ep is None:
                    raise TransportError(f"segment {segment.segment_id} offers no shm endpoint")
                _, pid, path = _parse(ep.address)
                try:
                    fd = os.open(path, os.O_RDWR)
                    try:
                        mm = mmap.mmap(fd, segment.capacity, mmap.MAP_SHARED)
                    finally:
                        os.close(fd)
                except (OSError, ValueError) as exc:
                    raise TransportError(f"cannot map segment {segment.segment_id} at {path}: {exc}; "
                                         "its daemon may have stopped") from exc
                entry = (mm, memoryview(mm), pid)
                self._maps[segment.segment_id] = entry
        _, view, pid = entry
        if not pid_alive(pid):
            self.forget(segment.segment_id)
            raise TransportError(f"daemon (pid {pid}) of segment {segment.segment_id} is gone")
        return view

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode) -> None:
        view = self._segment_view(segment)
        now_ms = int(time.time() * 1000)
        for t in transfers:
            g = t.grant
            if g.segment_id != segment.segment_id or g.mode != mode:
                raise InvalidArgument(f"grant for {g.segment_id}/{g.mode.name} used for "
                                      f"{segment.segment_id}/{mode.name}")
            if mode is GrantMode.WRITE and g.expires_ms < now_ms:
                # The space may already belong to another key: writing now could corrupt it.
                raise PermissionDenied(f"write grant expired {now_ms - g.expires_ms} ms ago: put again")
            if len(t.buffer) != g.length or g.offset + g.length > segment.capacity:
                raise InvalidArgument(f"buffer of {len(t.buffer)} bytes does not match grant "
                                      f"[{g.offset}, +{g.length}) in a {segment.capacity}-byte segment")
            remote = view[g.offset:g.offset + g.length]
            if mode is GrantMode.WRITE:
                remote[:] = t.buffer
            else:
                t.buffer[:] = remote

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> None:
        self._move(segment, transfers, GrantMode.WRITE)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> None:
        self._move(segment, transfers, GrantMode.READ)

    def forget(self, segment_id: str) -> None:
        with self._lock:
            entry = self._maps.pop(segment_id, None)
        if entry is not None:
            mm, view, _ = entry
            try:
                view.release()
                mm.close()
            except BufferError:
                pass   # a caller still holds a slice; the mapping is freed with it

    def close(self) -> None:
        for segment_id in list(self._maps):
            self.forget(segment_id)


class ShmServer(TransportServer):
    """Nothing to serve: advertising the segment file is the whole job."""

    name = "shm"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        pass

    def start(self) -> None:
        pass

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        if not isinstance(segment, DramSegment):
            return None
        return Endpoint(self.name, f"{host_id()}|{os.getpid()}|{segment.path}")

    def stop(self) -> None:
        pass
