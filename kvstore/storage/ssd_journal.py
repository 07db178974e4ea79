"""The SSD tier's journal: an append-only file of "key lives at [offset, +size) with checksum", and
of "key no longer lives at offset" (a deletion: a record of size 0, which no block has).

A block's record is appended only after its bytes are durable, so every record names bytes that
were on disk when it was written. A deletion is appended when the metadata service says it no
longer holds that block there (removed, replaced, evicted, moved away, or put there by a move it
abandoned), so a restart never offers it again. On-disk format (little endian)::

    file    = MAGIC record*
    record  = u32 payload_len · u64 xxh3_64(payload) · payload
    payload = u64 offset · u64 size · u64 checksum · key (UTF-8, payload_len - 24 bytes)

(A daemon from before deletions existed reads a deletion as an empty block that fails its checksum,
and drops it: mixing versions never brings a deleted block back.)

A crash can leave a torn last record; reading stops at the first record that is short or fails
its hash, and opening the journal cuts that tail off (with a warning) so later appends follow the
last good record.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from bisect import bisect_left, insort
from collections.abc import Iterable
from pathlib import Path

import xxhash

from kvstore.results import Block

log = logging.getLogger(__name__)

MAGIC = b"KVSJRNL1"  # bump the digit to change the format; never reuse it
_HEAD = struct.Struct("<IQ")
_BODY = struct.Struct("<QQQ")
_MAX_PAYLOAD = _BODY.size + 4 * 1024  # keys are at most 1024 UTF-8 bytes; anything longer is garbage


JournalRecord = Block  # which key lives where in the segment, and its checksum; size 0: a deletion


def deletion(block: Block) -> JournalRecord:
    """The record that `block` (key, offset, checksum) no longer lives in the segment."""
    return JournalRecord(block.key, block.offset, 0, block.checksum)


def encode(record: JournalRecord) -> bytes:
    payload = _BODY.pack(record.offset, record.size, record.checksum) + record.key.encode("utf-8", "surrogatepass")
    if len(payload) > _MAX_PAYLOAD:
        raise ValueError(f"key of {len(payload) - _BODY.size} bytes is too long to journal")
    return _HEAD.pack(len(payload), xxhash.xxh3_64_intdigest(payload)) + payload


def decode(data: bytes) -> tuple[list[JournalRecord], int]:
    """The records in `data` (a whole journal file) and the byte length of its valid prefix."""
    if not data:
        return [], 0
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):  # torn while the file was being created
            return [], 0
        raise ValueError(f"not a kvstore SSD journal (magic {data[: len(MAGIC)]!r}, want {MAGIC!r})")
    records, pos = [], len(MAGIC)
    while pos + _HEAD.size <= len(data):
        length, digest = _HEAD.unpack_from(data, pos)
        start, end = pos + _HEAD.size, pos + _HEAD.size + length
        if length < _BODY.size or length > _MAX_PAYLOAD or end > len(data):
            break
        payload = data[start:end]
        if xxhash.xxh3_64_intdigest(payload) != digest:
            break
        offset, size, checksum = _BODY.unpack_from(payload)
        try:
            key = payload[_BODY.size :].decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:
            break
        records.append(JournalRecord(key, offset, size, checksum))
        pos = end
    return records, pos


class Journal:
    """One journal file. Appends are serialised by a lock; each append is made durable before it
    returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            self._cut_torn_tail()
        except BaseException:
            os.close(self._fd)
            raise

    def _cut_torn_tail(self) -> None:
        data = self.path.read_bytes()
        _, valid = decode(data)
        if valid == 0:
            os.ftruncate(self._fd, 0)
            _write_all(self._fd, MAGIC)
            os.fdatasync(self._fd)
        elif valid < len(data):
            log.warning(
                "%s: ignoring %d bytes of torn or corrupt journal tail at byte %d", self.path, len(data) - valid, valid
            )
            os.ftruncate(self._fd, valid)
            os.fdatasync(self._fd)

    def replay(self) -> tuple[list[JournalRecord], int]:
        """Every valid record, oldest first, and the journal's length after the last of them."""
        with self._lock:
            records, end = decode(self.path.read_bytes())
        return records, end

    def append(self, records: Iterable[JournalRecord]) -> None:
        """Append `records` and fdatasync the journal: one sync however many records."""
        data = b"".join(encode(JournalRecord(*r)) for r in records)
        if data:
            with self._lock:
                _write_all(self._fd, data)
                os.fdatasync(self._fd)

    def compact(self, survivors: Iterable[JournalRecord], replayed_to: int) -> None:
        """Atomically replace the records before byte `replayed_to` (where replay() ended) with
        `survivors`, keeping whatever was appended since. A crash leaves the old journal or the
        new one, never a mix."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        head = MAGIC + b"".join(encode(JournalRecord(*r)) for r in survivors)
        with self._lock:
            appended_since = self.path.read_bytes()[replayed_to:]
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, head + appended_since)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
            new_fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            os.close(self._fd)
            self._fd = new_fd

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def live_records(records: Iterable[JournalRecord], alignment: int) -> list[JournalRecord]:
    """Replay `records` (oldest first) and return the surviving blocks sorted by offset.

    A block's record supersedes every earlier record whose reserved pages overlap its own (the
    space was freed and reused) and any earlier record of the same key (the key was written
    again). A deletion ends the live block of its key if that block is at its offset with its
    checksum (an older deletion, delivered late, never ends a newer block elsewhere).
    Invariant: live ranges never overlap, so in offset order their ends are sorted too.
    """

    def end(r: JournalRecord) -> int:
        return r.offset + max(-(-r.size // alignment) * alignment, alignment)

    starts: list[int] = []
    live: dict[int, JournalRecord] = {}
    offset_of: dict[str, int] = {}
    for r in records:
        if r.size == 0:
            at = offset_of.get(r.key)
            if at == r.offset and live[at].checksum == r.checksum:
                del offset_of[r.key], live[at]
                starts.remove(at)
            continue
        if r.key in offset_of:
            old = offset_of.pop(r.key)
            del live[old]
            starts.remove(old)
        i = bisect_left(starts, r.offset)
        if i > 0 and end(live[starts[i - 1]]) > r.offset:
            i -= 1
        j, stop = i, end(r)
        while j < len(starts) and starts[j] < stop:
            del offset_of[live.pop(starts[j]).key]
            j += 1
        del starts[i:j]
        insort(starts, r.offset)
        live[r.offset] = r
        offset_of[r.key] = r.offset
    return [live[s] for s in starts]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: Path) -> None:
    """Make a create, rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
