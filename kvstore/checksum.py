"""The per-block checksum: computed by the writer at put, stored in the index, verified at get."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import xxhash

# xxh3-64 runs at ~40 GB/s here, several times memcpy speed, so verifying every get is cheap.
ALGORITHM = "xxh3_64"


def checksum(data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def hasher() -> xxhash.xxh3_64:
    """An incremental checksum: update() with consecutive pieces, then intdigest() == checksum()."""
    return xxhash.xxh3_64()


# Bytes are copied and hashed a piece at a time, each piece hashed right after its copy while it is
# still in cache, so verifying costs little beyond the copy. Every copy-while-hashing uses these.
PIECE = 1 << 20

# From this size, on a host with two cores or more, a copy runs on the calling thread while a
# helper thread hashes each piece just after its copy, and maps the next pieces' pages where asked.
# numpy's copy and xxhash's update both release the GIL. Measured here, 16 MiB from a segment file
# (data out of cache), median ms per copy of 3 runs: 3.0-3.5 in one thread, 2.8-3.1 pipelined (a
# plain copy 2.4); pages not yet mapped: 4.0 in one thread, 3.4-3.7 with the mapping done ahead.
# Smaller copies stay on one thread: handing a piece over costs ~15 us, more than it saves.
PIPELINE_MIN = 4 << 20
PIPELINED = len(os.sched_getaffinity(0)) >= 2

Prepare = Callable[[int, int], None]  # (start, length) of a piece, called before that piece is copied


def copy_hashing(dst: memoryview, src: memoryview, h: xxhash.xxh3_64) -> None:
    """dst[:] = src, feeding src to `h` a piece at a time, right after that piece's copy."""
    for start in range(0, len(src), PIECE):
        piece = src[start : start + PIECE]
        dst[start : start + len(piece)] = piece
        h.update(dst[start : start + len(piece)])


def copy_with_checksum(dst: memoryview, src: memoryview, prepare: Prepare | None = None) -> int:
    """dst[:] = src, returning checksum(src) computed while the bytes are still in cache.

    `prepare(start, length)` runs before each piece is copied (a segment maps that piece's pages
    with it), ahead of the copy on the helper thread for a large copy."""
    if len(src) >= PIPELINE_MIN and PIPELINED:
        return _pipelined(dst, src, prepare)
    if prepare is not None:
        prepare(0, len(src))
    if len(src) <= PIECE:  # one piece: no incremental hasher
        dst[:] = src
        return xxhash.xxh3_64_intdigest(dst)
    h = hasher()
    copy_hashing(dst, src, h)
    return h.intdigest()


class _Helper:
    """A daemon thread that runs queued steps in order; each step's result (or exception) goes to
    the queue the step names. One per process, started at the first large copy."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.steps: queue.SimpleQueue[tuple[Callable[[Any], Any], Any, queue.SimpleQueue[Any] | None]] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="kvstore-copy-hash", daemon=True).start()

    def _run(self) -> None:
        while True:
            step, arg, done = self.steps.get()
            try:
                result = step(arg)
            except Exception as exc:  # noqa: BLE001 - handed to the caller, which raises it
                result = exc
            if done is not None:
                done.put(result)


_helper: _Helper | None = None
_helper_lock = threading.Lock()


def _the_helper() -> _Helper:
    global _helper
    helper = _helper
    if helper is None or helper.pid != os.getpid():  # none yet, or inherited through fork (no thread)
        with _helper_lock:
            if _helper is None or _helper.pid != os.getpid():
                _helper = _Helper()
            helper = _helper
    return helper


class HashPipe:
    """Checksums of consecutive buffers, computed on the helper thread, in order, while the caller
    fills them (today: a copy, in _pipelined). Feed each buffer's pieces with update() once they hold
    their bytes, end each buffer with digest(), and always call finish(): it waits for the helper
    to let go of every piece (also on the way out of an error) and returns the digests in order.
    run_ahead() queues other work for the helper (mapping the next pieces' pages); next_ack()
    waits for the oldest such step."""

    def __init__(self) -> None:
        self._steps = _the_helper().steps
        self._done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._h: xxhash.xxh3_64 | None = None

    def run_ahead(self, step: Callable[[int], None], arg: int) -> None:
        self._steps.put((step, arg, self._done))

    def next_ack(self) -> None:
        ack = self._done.get()
        if isinstance(ack, BaseException):
            try:
                raise ack
            finally:
                ack = None  # no cycle through this frame: the caller's buffers are let go with the error

    def update(self, piece: memoryview) -> None:
        if self._h is None:
            self._h = hasher()
        self._steps.put((self._h.update, piece, None))

    def digest(self) -> None:
        h, self._h = self._h or hasher(), None
        self._steps.put((_digest, h, self._done))

    def finish(self) -> list[int]:
        self._steps.put((_barrier, None, self._done))
        digests = []
        while (outcome := self._done.get()) is not _BARRIER:
            if isinstance(outcome, _Digest):
                digests.append(outcome.value)
            # else: an ack of a step run ahead that an error left unawaited
        return digests


class _Digest(NamedTuple):
    value: int


def _digest(h: xxhash.xxh3_64) -> _Digest:
    return _Digest(h.intdigest())


_BARRIER = object()


def _barrier(_: object) -> object:
    return _BARRIER


def _pipelined(dst: memoryview, src: memoryview, prepare: Prepare | None) -> int:
    """copy_with_checksum for large copies: this thread copies piece k while the helper hashes
    piece k-1 and prepares piece k+1."""
    d = np.frombuffer(dst, dtype=np.uint8)
    s = np.frombuffer(src, dtype=np.uint8)
    n = len(s)
    starts = range(0, n, PIECE)

    def prepare_piece(start: int) -> None:
        assert prepare is not None
        prepare(start, min(PIECE, n - start))

    pipe = HashPipe()
    try:
        if prepare is not None:  # the first two pieces' pages: then one more ahead of each copy
            for start in starts[:2]:
                pipe.run_ahead(prepare_piece, start)
        for i, start in enumerate(starts):
            if prepare is not None:
                pipe.next_ack()
            end = min(start + PIECE, n)
            np.copyto(d[start:end], s[start:end])
            pipe.update(dst[start:end])
            if prepare is not None and i + 2 < len(starts):
                pipe.run_ahead(prepare_piece, starts[i + 2])
        pipe.digest()
    finally:
        digests = pipe.finish()
    return digests[0]
