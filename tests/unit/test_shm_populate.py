"""The shm transport maps a segment's pages into the client once (MADV_POPULATE_*), not again on
every transfer of a range already mapped."""

from __future__ import annotations

import itertools
import mmap
import os

import pytest

from kvstore.checksum import PIECE, PIPELINE_MIN, PIPELINED
from kvstore.transport.shm import MADV_POPULATE, POPULATE_MIN, _Opened
from kvstore.types import GrantMode

SIZE = 8 << 20


class Recording:
    """An mmap whose madvise calls are recorded (mmap's methods cannot be patched)."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm
        self.calls: list[tuple[int, int, int]] = []

    def madvise(self, option: int, start: int, length: int) -> None:
        self.calls.append((option, start, length))
        self.mm.madvise(option, start, length)

    def __len__(self) -> int:
        return len(self.mm)


@pytest.fixture
def opened(tmp_path):
    path = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    fd = os.open(os.path.join(path, f"kvstore-test-populate-{os.getpid()}"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED)
    finally:
        os.unlink(os.path.join(path, f"kvstore-test-populate-{os.getpid()}"))
        os.close(fd)
    recording = Recording(mm)
    entry = _Opened(os.getpid(), mm=recording, view=memoryview(mm))  # type: ignore[arg-type]
    yield entry, recording
    entry.view.release()  # type: ignore[union-attr]
    mm.close()


def test_a_range_is_populated_once_per_mode(opened):
    entry, recording = opened
    data = os.urandom(POPULATE_MIN * 2)
    entry.move(4096, memoryview(data), GrantMode.WRITE)
    entry.move(4096, memoryview(data), GrantMode.WRITE)  # the same pages again: no madvise
    out = bytearray(len(data))
    entry.move(4096, memoryview(out), GrantMode.READ)  # written pages read without populating
    assert out == data
    assert [c[0] for c in recording.calls] == [MADV_POPULATE[GrantMode.WRITE]]


def test_reads_then_writes_populate_for_writing(opened):
    entry, recording = opened
    buf = bytearray(POPULATE_MIN)
    entry.move(1 << 20, memoryview(buf), GrantMode.READ)
    entry.move(1 << 20, memoryview(buf), GrantMode.READ)
    entry.move(1 << 20, memoryview(buf), GrantMode.WRITE)  # mapped for reading only: again, for writing
    entry.move(1 << 20, memoryview(buf), GrantMode.WRITE)
    assert [c[0] for c in recording.calls] == [MADV_POPULATE[GrantMode.READ], MADV_POPULATE[GrantMode.WRITE]]


def test_a_range_partly_mapped_is_populated_again(opened):
    entry, recording = opened
    entry.move(0, memoryview(bytearray(POPULATE_MIN)), GrantMode.READ)
    entry.move(POPULATE_MIN // 2, memoryview(bytearray(POPULATE_MIN)), GrantMode.READ)  # half new
    assert len(recording.calls) == 2 and recording.calls[1][1] == POPULATE_MIN // 2


def test_small_transfers_do_not_populate(opened):
    entry, recording = opened
    entry.move(0, memoryview(bytearray(POPULATE_MIN - 1)), GrantMode.READ)
    assert recording.calls == []


@pytest.mark.skipif(not PIPELINED, reason="one core: large copies stay on one thread")
def test_a_large_transfer_populates_piece_by_piece_ahead_of_the_copy(opened):
    entry, recording = opened
    data = os.urandom(PIPELINE_MIN + PIECE + 4096)  # pipelined: pieces mapped on the helper thread
    entry.move(4096, memoryview(data), GrantMode.WRITE)
    covered = [(start, start + length) for _, start, length in recording.calls]
    assert covered[0][0] == 4096 and covered[-1][1] == 4096 + len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))  # in order, no gap
    assert {c[0] for c in recording.calls} == {MADV_POPULATE[GrantMode.WRITE]}
    calls = len(recording.calls)
    out = bytearray(len(data))
    entry.move(4096, memoryview(out), GrantMode.READ)
    assert out == data and len(recording.calls) == calls  # mapped already
