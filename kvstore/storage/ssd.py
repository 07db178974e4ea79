"""SSD tier: a segment is a preallocated file on local disk, written with O_DIRECT where allowed.

Files in the segment's directory, for segment number `index`:

    ssd-{index}.data     the bytes, preallocated to `capacity`
    ssd-{index}.id       the segment id, made once, so it survives daemon restarts
    ssd-{index}.journal  which key lives where, and which the service deleted
                         (kvstore.storage.ssd_journal), for recovery

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
import struct
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from ctypes import addressof, c_char
from pathlib import Path

from kvstore.checksum import checksum
from kvstore.observe import SsdIoObserver
from kvstore.results import Block
from kvstore.storage.base import DroppedBlock, RecoveryReport, SegmentStorage
from kvstore.storage.ssd_journal import Journal, JournalRecord, deletion, fsync_dir, live_records
from kvstore.types import Tier

log = logging.getLogger(__name__)

ALIGN = 4096
CHUNK = 8 << 20  # bounce buffer size: large enough that one syscall moves a lot
_ZERO_PAGE = bytes(ALIGN)
_TIMEVAL = struct.Struct("@ll")
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # absent on macOS: buffered only


class SsdSegment(SegmentStorage):
    tier = Tier.SSD
    alignment = ALIGN
    io: SsdIoObserver | None = None  # the daemon's metrics, when it has them
    _unjournaled_since: float | None = None  # perf_counter of the oldest write not yet journaled

    def __init__(
        self,
        segment_id: str,
        capacity: int,
        path: Path,
        fd: int,
        direct_fd: int | None,
        journal: Journal,
        extra_paths: tuple[Path, ...],
    ) -> None:
        """Use SsdSegment.open."""
        self.segment_id = segment_id
        self.capacity = capacity
        self.path = path
        self._fd = fd
        self._direct_fd = direct_fd
        self._direct = direct_fd is not None
        self._journal = journal
        self._extra_paths = extra_paths
        self._pool: list[mmap.mmap] = []  # idle bounce buffers; one per concurrent writer
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
                raise BlockingIOError(
                    errno.EWOULDBLOCK, f"{path} is already open (another daemon on this directory?)"
                ) from exc
            size = os.fstat(fd).st_size
            if size == 0:
                os.posix_fallocate(fd, 0, capacity)
            elif size != capacity:
                raise ValueError(
                    f"{path} holds a {size}-byte segment but capacity {capacity} was "
                    "asked; reopen with the old capacity, or delete the files to start over"
                )
            segment_id = _load_or_create_id(directory / f"ssd-{index}.id")
            direct_fd = open_direct(path) if direct else None
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
    def _direct_write_fd(self) -> int:
        assert self._direct_fd is not None, "O_DIRECT writes without an O_DIRECT descriptor"
        return self._direct_fd

    @property
    def direct(self) -> bool:
        """Whether writes currently go through O_DIRECT."""
        return self._direct

    def read_into(self, offset: int, dest: memoryview) -> None:
        dest = memoryview(dest).cast("B")
        self._check_range(offset, len(dest))
        begun = time.perf_counter()
        pread_all(self._fd, dest, offset)
        if self.io is not None:
            self.io.io("read", len(dest), time.perf_counter() - begun)

    def write_from(self, offset: int, src: memoryview) -> None:
        """Write src at `offset`. Not durable by itself: record() makes it so. With O_DIRECT the
        tail is zero-padded to the next 4096 boundary, which the allocator reserved for this block."""
        src = memoryview(src).cast("B")
        self._check_range(offset, len(src))
        if not src:
            return
        begun = time.perf_counter()
        self._write(offset, src)
        if self.io is not None:
            self.io.io("write", len(src), time.perf_counter() - begun)
            if self._unjournaled_since is None:
                self._unjournaled_since = begun

    def _write(self, offset: int, src: memoryview) -> None:
        if self._direct and offset % ALIGN == 0:
            try:
                if _page_aligned(src):
                    pwrite_all(self._direct_write_fd, src, offset)
                else:
                    self._write_bounced(offset, src)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # The fd stays open until close(): another thread may be using it right now.
                log.warning(
                    "%s: O_DIRECT write refused (%s); falling back to buffered writes", self.path, exc.strerror
                )  # not exc: its traceback pins slices of a bounce buffer
                self._direct = False
        pwrite_all(self._fd, src, offset)

    def _write_bounced(self, offset: int, src: memoryview) -> None:
        with self._bounce() as bounce:
            for pos in range(0, len(src), CHUNK):
                chunk = src[pos : pos + CHUNK]
                n = len(chunk)
                padded = n + (-n % ALIGN)
                bounce[:n] = chunk
                bounce[n:padded] = _ZERO_PAGE[: padded - n]
                pwrite_all(self._direct_write_fd, bounce[:padded], offset + pos)

    @contextmanager
    def _bounce(self) -> Iterator[memoryview]:
        with self._pool_lock:
            buf = self._pool.pop() if self._pool else mmap.mmap(-1, CHUNK)  # mmap is page aligned
        try:
            with memoryview(buf) as view:
                yield view
        finally:
            with self._pool_lock:
                self._pool.append(buf)

    def sendfile(self, sock: socket.socket, offset: int, length: int, deadline: float | None = None) -> None:
        """Send [offset, +length) of the data file to `sock` without copying through Python, by
        `deadline` (a time.monotonic() value; TimeoutError after it); OSError if the peer goes."""
        self._check_range(offset, length)
        begun = time.perf_counter()
        self._sendfile(sock, offset, length, deadline)
        if self.io is not None:
            self.io.io("read", length, time.perf_counter() - begun)

    def _sendfile(self, sock: socket.socket, offset: int, length: int, deadline: float | None) -> None:
        out = sock.fileno()
        end = offset + length
        while offset < end:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"sendfile to {sock!r} did not finish by its deadline")
                seconds = int(left)
                sock.setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDTIMEO, _TIMEVAL.pack(seconds, max(1, int((left - seconds) * 1e6)))
                )
            try:
                sent = os.sendfile(out, self._fd, offset, min(end - offset, 1 << 30))
            except BlockingIOError:  # the send timeout fired, or the socket is non-blocking
                if deadline is None:
                    poller = select.poll()
                    poller.register(out, select.POLLOUT)
                    timeout = sock.gettimeout()
                    if not poller.poll(None if timeout is None else timeout * 1000):
                        raise TimeoutError(f"sendfile to {sock!r} timed out") from None
                continue
            if sent == 0:
                raise OSError(errno.EIO, f"sendfile hit the end of {self.path} at byte {offset}")
            offset += sent

    def record(self, key: str, offset: int, size: int, checksum: int) -> None:
        """Journal that `key` lives at [offset, +size) with `checksum`, once its bytes are durable."""
        self.record_many([JournalRecord(key, offset, size, checksum)])

    def record_many(self, records: Iterable[Block]) -> None:
        """record() for many blocks: one fdatasync of the data and one of the journal."""
        records = [JournalRecord(*r) for r in records]
        for r in records:
            self._check_range(r.offset, r.size)
        os.fdatasync(self._fd)  # the bytes first, so no record ever names bytes not on disk
        self._journal.append(records)
        since, self._unjournaled_since = self._unjournaled_since, None
        if self.io is not None and since is not None:
            self.io.journal_lag(time.perf_counter() - since)

    def forget_many(self, blocks: Iterable[Block]) -> None:
        """Journal that each block (key, offset, checksum) no longer lives here: the metadata
        service dropped it (removed, replaced, evicted, moved away) or never took it (an abandoned
        move). Durable when this returns; recover() never returns such a block again."""
        self._journal.append([deletion(b) for b in blocks])

    def recover(self) -> RecoveryReport:
        """Replay the journal: which blocks this segment still holds, verified by checksum.

        A later record supersedes earlier ones whose pages overlap it (the space was reused) or
        that have the same key, and a deletion ends the block it names. Blocks whose bytes fail
        their checksum are dropped (and logged), never returned. Then the journal is compacted to
        the survivors.

        A block the service dropped shortly before a crash may still be returned (its deletion is
        journaled when the daemon next claims its tasks): the service refuses such a block when
        it is re-announced, and has it deleted then.
        Safe while the daemon serves: records made during recovery are kept (not verified).
        """
        blocks: list[Block] = []
        dropped: list[DroppedBlock] = []
        buf = bytearray()
        records, replayed_to = self._journal.replay()
        for r in live_records(records, ALIGN):
            if r.offset + r.size > self.capacity:
                reason = f"[{r.offset}, +{r.size}) is outside the {self.capacity}-byte segment"
            else:
                if len(buf) < r.size:
                    buf = bytearray(r.size)
                with memoryview(buf)[: r.size] as view:
                    try:
                        self.read_into(r.offset, view)
                        reason = "" if checksum(view) == r.checksum else "checksum mismatch"
                    except OSError as exc:
                        reason = f"read failed: {exc}"
            if not reason:
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
                except BufferError:  # a view is still alive somewhere; the GC frees the buffer
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


def open_direct(path: Path) -> int | None:
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


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def pread_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise OSError(errno.EIO, f"unexpected end of file at byte {offset}")
        view, offset = view[n:], offset + n
