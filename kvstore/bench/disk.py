"""The raw disk's ceiling: what the disk under a directory does without kvstore, measured in the
same run as the SSD tier it is compared with (`kvstore bench --tiers`)."""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from kvstore.storage.ssd import CHUNK, open_direct, pread_all, pwrite_all


class DiskCeiling(NamedTuple):
    """Single-stream sequential throughput of the raw disk, GB/s (1e9 bytes/s). The direct
    figures are None where the filesystem refuses O_DIRECT."""

    size: int
    buffered_write_gbps: float
    buffered_read_gbps: float
    direct_write_gbps: float | None
    direct_read_gbps: float | None


def raw_disk_ceiling(directory: Path | str, size: int = 1 << 30) -> DiskCeiling:
    """Measure what the disk under `directory` does without kvstore, buffered and with O_DIRECT:
    sequential 8 MiB writes of `size` bytes (rounded to 8 MiB) into a freshly preallocated file,
    as the SSD tier does, then fdatasync; then reads of them, cold (O_DIRECT, or buffered after
    dropping the file's page cache). Temporary files are always removed."""
    size = max(size // CHUNK, 1) * CHUNK
    with mmap.mmap(-1, CHUNK) as buf:
        buf[:] = os.urandom(CHUNK)  # incompressible, in case the device compresses
        buffered = _measure(Path(directory), buf, size, direct=False)
        direct = _measure(Path(directory), buf, size, direct=True)
    assert buffered is not None  # only O_DIRECT may be refused
    direct_write, direct_read = direct if direct is not None else (None, None)
    return DiskCeiling(size, buffered[0], buffered[1], direct_write, direct_read)


def _measure(directory: Path, buf: mmap.mmap, size: int, direct: bool) -> tuple[float, float] | None:
    fd, name = tempfile.mkstemp(prefix=".kvstore-ceiling-", dir=directory)
    io_fd = None
    try:
        os.posix_fallocate(fd, 0, size)
        io_fd = open_direct(Path(name)) if direct else fd
        if io_fd is None:
            return None
        write = _timed_pass(io_fd, buf, size, write=True)
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_DONTNEED)
        return write, _timed_pass(io_fd, buf, size, write=False)
    except OSError as exc:
        if not direct or exc.errno != errno.EINVAL:
            raise
        return None
    finally:
        if io_fd is not None and io_fd != fd:
            os.close(io_fd)
        os.close(fd)
        os.unlink(name)


def _timed_pass(fd: int, buf: mmap.mmap, size: int, write: bool) -> float:
    with memoryview(buf) as view:
        start = time.perf_counter()
        for offset in range(0, size, CHUNK):
            (pwrite_all if write else pread_all)(fd, view, offset)
        if write:
            os.fdatasync(fd)
        return size / (time.perf_counter() - start) / 1e9
