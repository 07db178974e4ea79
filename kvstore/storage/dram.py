"""DRAM tier: a segment is a file in shared memory (/dev/shm), mapped by the daemon.

Because the memory is a named file, same-host clients map it too (the `shm` transport) and copy
with one memcpy.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from kvstore.storage.base import SegmentStorage
from kvstore.types import Tier


class DramSegment(SegmentStorage):
    tier = Tier.DRAM

    def __init__(self, segment_id: str, capacity: int, shm_dir: str = "/dev/shm", map_pages: bool = True) -> None:
        self.segment_id = segment_id
        self.capacity = capacity
        # The pid in the name lets a later daemon sweep files left by one that was killed.
        self.path = Path(shm_dir) / f"kvstore-{os.getpid()}-{segment_id}"
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, capacity)
            # Allocate the pages now (~0.25 s per GiB), so the first write of each block does not
            # pay for zero-filling fresh tmpfs pages, and a full /dev/shm fails here, not mid-put.
            os.posix_fallocate(fd, 0, capacity)
            self._mmap = mmap.mmap(fd, capacity, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if map_pages:
                _map_pages(self._mmap)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        self._view = memoryview(self._mmap)

    def view(self, offset: int, length: int) -> memoryview:
        self._check_range(offset, length)
        return self._view[offset : offset + length]

    def read_into(self, offset: int, dest: memoryview) -> None:
        dest[:] = self.view(offset, len(dest))

    def write_from(self, offset: int, src: memoryview) -> None:
        self.view(offset, len(src))[:] = src

    def close(self, remove: bool = True) -> None:
        try:
            self._view.release()
            self._mmap.close()
        except BufferError:
            # A transport still holds a view; the mapping goes when the process exits.
            pass
        if remove:
            self.path.unlink(missing_ok=True)


# MADV_POPULATE_WRITE (Linux 5.14): map every page of the segment into the daemon now.
_MADV_POPULATE_WRITE = 23
_POPULATE_STEP = 32 << 20  # per call: the GIL is held through it


def _map_pages(mm: mmap.mmap) -> None:
    """Map the segment's pages into this process once, at creation (~0.3 s per GiB here, besides
    fallocate's 0.1), so that no transfer the daemon serves (tcp, ucx, mooncake: a copy into or
    out of this mapping) takes a page fault per 4 KiB on space it has not touched before: those
    cost ~0.37 ms per MiB here. Older kernels: the pages fault in on use, as before."""
    for start in range(0, len(mm), _POPULATE_STEP):
        try:
            mm.madvise(_MADV_POPULATE_WRITE, start, min(_POPULATE_STEP, len(mm) - start))
        except OSError:
            return
