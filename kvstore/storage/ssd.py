"""SSD tier: a segment is a preallocated file on local disk, written with O_DIRECT where allowed.

Files in the segment's directory, for segment number `index`:

    ssd-{index}.data     the bytes, preallocated to `capacity`
    ssd-{index}.id       the segment id, made once, so it survives daemon restarts
    ssd-{index}.journal  which key lives where (kvstore.storage.journal), for recovery

Writes go through O_DIRECT (a page-aligned bounce buffer, tails zero-padded to 4096 inside the
block's reserved pages: the allocator aligns SSD blocks to 4096 and reserves whole pages) and fall
back to buffered writes on filesystems that refuse it (tmpfs, overlayfs). Reads are preadv
straight into the caller's buffer, or sendfile straight to a socket. All I/O is positional, so
any number of threads may read and write disjoint ranges at once.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import select
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from ctypes import addressof, c_char
from pathlib import Path
from typing import NamedTuple

from kvstore.checksum import checksum
from kvstore.storage.base import SegmentStorage
from kvstore.storage.journal import Journal, JournalRecord, fsync_dir, live_records
from kvstore.types import Tier

log = logging.getLogger(__name__)

ALIGN = 4096
CHUNK = 8 << 20                 # bounce buffer size: large enough that one syscall moves a lot
_ZERO_PAGE = bytes(ALIGN)
_O_DIRECT = getattr(os, "O_DIRECT", 0)      # absent on macOS: buffered only

RecoveredBlock = JournalRecord      # a journal record whose bytes passed their checksum


class DroppedBlock(NamedTuple):
    key: str
    reason: str


class RecoveryReport(NamedTuple):
    blocks: list[RecoveredBlock]
    dropped: list[DroppedBlock]


class DiskCeiling(NamedTuple):
    """Single-stream sequential throughput of the raw disk, GB/s (1e9 bytes/s). The direct
    figures are None where the filesystem refuses O_DIRECT."""

    size: int
    buffered_write_gbps: float
    buffered_read_gbps: float
    direct_write_gbps: float | None
    direct_read_gbps: float | None


class SsdSegment(SegmentStorage):
    persistent = True
    tier = Tier.SSD
    alignment = ALIGN

    def __init__(self, segment_id: str, capacity: int, path: Path, fd: int, direct_fd: int | None,
                 journal: Journal, extra_paths: tuple[Path, ...]) -> None:
        """Use SsdSegment.open."""
        self.segment_id = segment_id
        self.capacity = capacity
        self.path = path
        self._fd = fd
        self._direct_fd = direct_fd
        self._direct = direct_fd is not None
        self._journal = journal
        self._extra_paths = extra_paths
        self._pool: list[mmap.mmap] = []        # idle bounce buffers; one per concurrent writer
        self._pool_lock = threading.Lock()

    @classmethod
    def open(cls, directory: Path, index: int, capacity: int, *, direct: bool = True) -> SsdSegment:
        """Create segment `index` in `directory`, or reopen it with its data, id and journal.

        `capacity` is rounded down to 4096. Raises ValueError if an existing data file has another
        size (nothing is truncated), BlockingIOError if another SsdSegment holds it open.
        With direct=False, or where the filesystem refuses O_DIRECT, writes are buffered.
        """
        directory = Path(directory)
        capacity -= capacity % ALIGN
        if capacity <= 0:
            raise ValueError(f"SSD segment capacity must be at least {ALIGN} bytes")
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"ssd-{index}.data"
        fds: list[int] = []
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fds.append(fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise BlockingIOError(errno.EWOULDBLOCK, f"{path} is already open (another daemon "
                                                         "on this directory?)") from exc
            size = os.fstat(fd).st_size
            if size == 0:
                os.posix_fallocate(fd, 0, capacity)
            elif size != capacity:
                raise ValueError(f"{path} holds a {size}-byte segment but capacity {capacity} was "
                                 "asked; reopen with the old capacity, or delete the files to start over")
            segment_id = _load_or_create_id(directory / f"ssd-{index}.id")
            direct_fd = _open_direct(path) if direct else None
            if direct_fd is not None:
                fds.append(direct_fd)
            journal = Journal(directory / f"ssd-{index}.journal")
            fsync_dir(directory)
        except BaseException:
            for f in fds:
                os.close(f)
            raise
        extra = (directory / f"ssd-{index}.id", journal.path)
        return cls(segment_id, capacity, path, fd, direct_fd, journal, extra)

    @property
    def direct(self) -> bool:
        """Whether writes currently go through O_DIRECT."""
        return self._direct

    def read_into(self, offset: int, dest: memoryview) -> None:
        dest = memoryview(dest).cast("B")
        self._check_range(offset, len(dest))
        _pread_all(self._fd, dest, offset)

    def write_from(self, offset: int, src: memoryview) -> None:
        """Write src at `offset`. Not durable by itself: record() makes it so. With O_DIRECT the
        tail is zero-padded to the next 4096 boundary, which the allocator reserved for this block."""
        src = memoryview(src).cast("B")
        self._check_range(offset, len(src))
        if not src:
            return
        if self._direct and offset % ALIGN == 0:
            try:
                if _page_aligned(src):
                    _pwrite_all(self._direct_fd, src, offset)
                else:
                    self._write_bounced(offset, src)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # The fd stays open until close(): another thread may be using it right now.
                log.warning("%s: O_DIRECT write refused (%s); falling back to buffered writes", self.path,
                            exc.strerror)     # not exc: its traceback pins slices of a bounce buffer
                self._direct = False
        _pwrite_all(self._fd, src, offset)

    def _write_bounced(self, offset: int, src: memoryview) -> None:
        with self._bounce() as bounce:
            for pos in range(0, len(src), CHUNK):
                chunk = src[pos:pos + CHUNK]
                n = len(chunk)
                padded = n + (-n % ALIGN)
                bounce[:n] = chunk
                bounce[n:padded] = _ZERO_PAGE[:padded - n]
                _pwrite_all(self._direct_fd, bounce[:padded], offset + pos)

    @contextmanager
    def _bounce(self) -> Iterator[memoryview]:
        with self._pool_lock:
            buf = self._pool.pop() if self._pool else mmap.mmap(-1, CHUNK)    # mmap is page aligned
        try:
            with memoryview(buf) as view:
                yield view
        finally:
            with self._pool_lock:
                self._pool.append(buf)

    def sendfile(self, sock: socket.socket, offset: int, length: int) -> None:
        """Send [offset, +length) of the data file to `sock` without copying through Python.
        Honours the socket's timeout (TimeoutError); raises OSError if the peer goes away."""
        self._check_range(offset, length)
        out, timeout = sock.fileno(), sock.gettimeout()
        end = offset + length
        while offset < end:
            try:
                sent = os.sendfile(out, self._fd, offset, min(end - offset, 1 << 30))
            except BlockingIOError:
                poller = select.poll()
                poller.register(out, select.POLLOUT)
                if not poller.poll(None if timeout is None else timeout * 1000):
                    raise TimeoutError(f"sendfile to {sock!r} timed out") from None
                continue
            if sent == 0:
                raise OSError(errno.EIO, f"sendfile hit the end of {self.path} at byte {offset}")
            offset += sent

    def record(self, key: str, offset: int, size: int, checksum: int) -> None:
        """Journal that `key` lives at [offset, +size) with `checksum`, once its bytes are durable."""
        self.record_many([JournalRecord(key, offset, size, checksum)])

    def record_many(self, records: Iterable[tuple[str, int, int, int]]) -> None:
        """record() for many blocks: one fdatasync of the data and one of the journal."""
        records = [JournalRecord(*r) for r in records]
        for r in records:
            self._check_range(r.offset, r.size)
        os.fdatasync(self._fd)      # the bytes first, so no record ever names bytes not on disk
        self._journal.append(records)

    def recover(self) -> RecoveryReport:
        """Replay the journal: which blocks this segment still holds, verified by checksum.

        A later record supersedes earlier ones whose pages overlap it (the space was reused) or
        that have the same key. Blocks whose bytes fail their checksum are dropped (and logged),
        never returned. Then the journal is compacted to the survivors.

        Deletions are not journaled (the metadata service frees space without telling the daemon),
        so a block deleted before a restart comes back here unless its space was rewritten. That
        is harmless: keys are content addressed, so a resurrected block holds the right bytes.
        Safe while the daemon serves: records made during recovery are kept (not verified).
        """
        blocks: list[RecoveredBlock] = []
        dropped: list[DroppedBlock] = []
        buf = bytearray()
        records, replayed_to = self._journal.replay()
        for r in live_records(records, ALIGN):
            if r.offset + r.size > self.capacity:
                reason = f"[{r.offset}, +{r.size}) is outside the {self.capacity}-byte segment"
            else:
                if len(buf) < r.size:
                    buf = bytearray(r.size)
                with memoryview(buf)[:r.size] as view:
                    try:
                        self.read_into(r.offset, view)
                        reason = None if checksum(view) == r.checksum else "checksum mismatch"
                    except OSError as exc:
                        reason = f"read failed: {exc}"
            if reason is None:
                blocks.append(r)
            else:
                log.warning("%s: dropping block %r at [%d, +%d): %s", self.path, r.key, r.offset, r.size, reason)
                dropped.append(DroppedBlock(r.key, reason))
        self._journal.compact(blocks, replayed_to)
        return RecoveryReport(blocks, dropped)

    def close(self, remove: bool = True) -> None:
        """Close the files (call once no request is using the segment). With remove, delete the
        data, id and journal; without, the next open() of this directory and index finds them."""
        if self._fd < 0:
            return
        self._journal.close()
        for fd in (self._fd, self._direct_fd):
            if fd is not None:
                os.close(fd)
        self._fd, self._direct_fd, self._direct = -1, None, False
        with self._pool_lock:
            for buf in self._pool:
                try:
                    buf.close()
                except BufferError:     # a view is still alive somewhere; the GC frees the buffer
                    pass
            self._pool.clear()
        if remove:
            for p in (self.path, *self._extra_paths):
                p.unlink(missing_ok=True)


def _load_or_create_id(path: Path) -> str:
    try:
        segment_id = path.read_text().strip()
        if segment_id:
            return segment_id
    except FileNotFoundError:
        pass
    segment_id = f"ssd-{uuid.uuid4().hex[:12]}"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(segment_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return segment_id


def _open_direct(path: Path) -> int | None:
    if not _O_DIRECT:
        return None
    try:
        return os.open(path, os.O_RDWR | _O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        log.info("%s: filesystem refuses O_DIRECT; writes will be buffered", path)
        return None


def _page_aligned(view: memoryview) -> bool:
    """Whether O_DIRECT can take `view` as it is (needs a writable buffer to find its address)."""
    if view.readonly or len(view) % ALIGN:
        return False
    return addressof(c_char.from_buffer(view)) % ALIGN == 0


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _pread_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise OSError(errno.EIO, f"unexpected end of file at byte {offset}")
        view, offset = view[n:], offset + n


def raw_disk_ceiling(directory: Path | str, size: int = 1 << 30) -> DiskCeiling:
    """Measure what the disk under `directory` does without kvstore, buffered and with O_DIRECT:
    sequential 8 MiB writes of `size` bytes (rounded to 8 MiB) into a freshly preallocated file,
    as the SSD tier does, then fdatasync; then reads of them, cold (O_DIRECT, or buffered after
    dropping the file's page cache). Temporary files are always removed."""
    size = max(size // CHUNK, 1) * CHUNK
    with mmap.mmap(-1, CHUNK) as buf:
        buf[:] = os.urandom(CHUNK)      # incompressible, in case the device compresses
        buffered = _measure(Path(directory), buf, size, direct=False)
        direct = _measure(Path(directory), buf, size, direct=True)
    return DiskCeiling(size, *buffered, *(direct or (None, None)))


def _measure(directory: Path, buf: mmap.mmap, size: int, direct: bool) -> tuple[float, float] | None:
    fd, name = tempfile.mkstemp(prefix=".kvstore-ceiling-", dir=directory)
    io_fd = None
    try:
        os.posix_fallocate(fd, 0, size)
        io_fd = _open_direct(Path(name)) if direct else fd
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
            (_pwrite_all if write else _pread_all)(fd, view, offset)
        if write:
            os.fdatasync(fd)
        return size / (time.perf_counter() - start) / 1e9
