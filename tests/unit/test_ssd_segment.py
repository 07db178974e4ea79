"""The SSD tier on real files: round trips with and without O_DIRECT, concurrency, sendfile,
reopening, and journal recovery (corrupt blocks, reused space, torn tails)."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.bench.disk import raw_disk_ceiling
from kvstore.checksum import checksum
from kvstore.results import Block
from kvstore.storage.ssd import SsdSegment
from kvstore.storage.ssd_journal import MAGIC, JournalRecord, encode, live_records
from kvstore.types import Tier

MiB = 1 << 20
CAPACITY = 64 * MiB
SIZES = [1, 4095, 4096, 4097, MiB + 3, 16 * MiB]


def pages(n: int) -> int:
    return -(-n // 4096) * 4096


@pytest.fixture(params=[True, False], ids=["direct", "buffered"])
def segment(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SsdSegment]:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY, direct=request.param)
    yield seg
    assert seg.direct == request.param  # the direct cases really went through O_DIRECT
    seg.close()


def put(seg: SsdSegment, key: str, offset: int, data: bytes) -> None:
    seg.write_from(offset, memoryview(data))
    seg.record(key, offset, len(data), checksum(data))


def read(seg: SsdSegment, offset: int, size: int) -> bytes:
    out = bytearray(size)
    seg.read_into(offset, memoryview(out))
    return bytes(out)


def test_files_and_attributes(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 3, CAPACITY + 100)
    assert seg.tier is Tier.SSD and seg.alignment == 4096 and seg.capacity == CAPACITY
    assert seg.path == tmp_path / "ssd-3.data" and seg.path.stat().st_size == CAPACITY
    assert (tmp_path / "ssd-3.id").read_text().strip() == seg.segment_id
    assert (tmp_path / "ssd-3.journal").exists()
    assert seg.view(0, 10) is None
    assert seg.direct  # ext4 under /tmp takes O_DIRECT
    seg.close()
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("size", SIZES)
def test_round_trip(segment: SsdSegment, size: int) -> None:
    offsets = [0, pages(size), CAPACITY - pages(size)]  # adjacent blocks, and the last page
    blobs = [os.urandom(size) for _ in offsets]
    for offset, blob in zip(offsets, blobs):
        segment.write_from(offset, memoryview(blob))
    for offset, blob in zip(offsets, blobs):
        assert read(segment, offset, size) == blob


def test_aligned_source_is_written_as_is(segment: SsdSegment) -> None:
    with mmap.mmap(-1, 2 * MiB) as buf:
        buf[:] = os.urandom(2 * MiB)
        segment.write_from(8192, memoryview(buf))
        assert read(segment, 8192, 2 * MiB) == buf[:]
    segment.write_from(0, memoryview(bytearray(b"x" * 8192))[1:4097])  # writable, unaligned
    assert read(segment, 0, 4096) == b"x" * 4096


def test_direct_write_zero_pads_the_tail_page(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    seg.write_from(0, memoryview(b"\xff" * 8192))
    seg.write_from(0, memoryview(b"abc"))
    assert read(seg, 0, 8192) == b"abc" + bytes(4093) + b"\xff" * 4096
    seg.close()


def test_out_of_range_is_refused(segment: SsdSegment) -> None:
    with pytest.raises(ValueError):
        segment.write_from(CAPACITY - 4096, memoryview(bytes(4097)))
    with pytest.raises(ValueError):
        segment.read_into(CAPACITY, memoryview(bytearray(1)))
    with pytest.raises(ValueError):
        segment.record("k", CAPACITY, 1, 0)


def test_concurrent_disjoint_writes_and_reads(segment: SsdSegment) -> None:
    region = CAPACITY // 4
    start = threading.Barrier(4)
    failures: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            start.wait()
            blocks = []
            offset = n * region
            for i in range(12):
                size = (i * 123_457) % (2 * MiB) + 1
                blob = os.urandom(size)
                segment.write_from(offset, memoryview(blob))
                blocks.append((offset, blob))
                offset += pages(size)
            assert offset <= (n + 1) * region
            for offset, blob in blocks:
                assert read(segment, offset, len(blob)) == blob
        except BaseException as exc:  # noqa: BLE001  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_sendfile_to_socket(segment: SsdSegment) -> None:
    blob = os.urandom(3 * MiB + 5)
    segment.write_from(4096, memoryview(blob))
    left, right = socket.socketpair()
    received = bytearray()

    def drain() -> None:
        while chunk := right.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    with left:
        segment.sendfile(left, 4096 + 7, len(blob) - 7)
    reader.join()
    right.close()
    assert bytes(received) == blob[7:]


def test_sendfile_to_closed_peer_raises(segment: SsdSegment) -> None:
    left, right = socket.socketpair()
    right.close()
    with left, pytest.raises(OSError):
        segment.sendfile(left, 0, MiB)


def test_reopen_keeps_id_and_data(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 1, CAPACITY)
    blob = os.urandom(10_000)
    put(seg, "a", 8192, blob)
    segment_id = seg.segment_id
    seg.close(remove=False)

    again = SsdSegment.open(tmp_path, 1, CAPACITY)
    assert again.segment_id == segment_id
    assert read(again, 8192, len(blob)) == blob
    assert again.recover().blocks == [("a", 8192, len(blob), checksum(blob))]
    again.close()
    assert not list(tmp_path.iterdir())


def test_ids_differ_between_segments(tmp_path: Path) -> None:
    a, b = SsdSegment.open(tmp_path, 0, CAPACITY), SsdSegment.open(tmp_path, 1, CAPACITY)
    assert a.segment_id != b.segment_id
    a.close()
    b.close()


def test_capacity_mismatch_raises_and_keeps_the_file(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    put(seg, "a", 0, b"kept")
    seg.close(remove=False)
    with pytest.raises(ValueError, match="capacity"):
        SsdSegment.open(tmp_path, 0, CAPACITY // 2)
    again = SsdSegment.open(tmp_path, 0, CAPACITY)
    assert [b.key for b in again.recover().blocks] == ["a"]
    again.close()


def test_second_open_of_the_same_segment_is_refused(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    with pytest.raises(BlockingIOError):
        SsdSegment.open(tmp_path, 0, CAPACITY)
    seg.close()


def test_record_and_recover(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    blobs = {f"t/m/l/{i:04x}": os.urandom(1000 * i + 1) for i in range(8)}
    offset = 0
    expected: list[Block] = []
    for key, blob in blobs.items():
        seg.write_from(offset, memoryview(blob))
        expected.append(Block(key, offset, len(blob), checksum(blob)))
        offset += pages(len(blob))
    seg.record_many(expected[:5])
    for r in expected[5:]:
        seg.record(*r)
    seg.close(remove=False)

    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    report = seg.recover()
    assert report.blocks == expected and report.dropped == []
    seg.close()


def test_corrupt_block_is_dropped_and_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    for i, key in enumerate(["good-1", "bad", "good-2"]):
        put(seg, key, i * 4096 * 4, os.urandom(10_000))
    seg.close(remove=False)
    with open(tmp_path / "ssd-0.data", "r+b") as f:  # flip one byte of "bad"
        f.seek(4096 * 4 + 1234)
        byte = f.read(1)[0]
        f.seek(4096 * 4 + 1234)
        f.write(bytes([byte ^ 0x40]))

    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    with caplog.at_level(logging.WARNING, logger="kvstore.storage.ssd"):
        report = seg.recover()
    assert [b.key for b in report.blocks] == ["good-1", "good-2"]
    assert report.dropped == [("bad", "checksum mismatch")]
    assert "'bad'" in caplog.text
    assert seg.recover().dropped == []  # the journal was compacted to the survivors
    seg.close()


def test_block_outside_the_segment_is_dropped(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    # Planted through the segment's journal: no public call writes a block outside the segment,
    # which is exactly the corruption recovery must drop.
    seg._journal.append([JournalRecord("far", CAPACITY, 10, 0)])
    assert [d.key for d in seg.recover().dropped] == ["far"]
    seg.close()


def test_later_overlapping_record_supersedes(tmp_path: Path) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    put(seg, "old-big", 0, os.urandom(3 * 4096))  # pages 0-2
    put(seg, "neighbour", 3 * 4096, os.urandom(100))  # page 3
    put(seg, "new", 4096, os.urandom(5000))  # pages 1-2: reuses old-big's space
    put(seg, "moved", 5 * 4096, b"x")
    put(seg, "moved", 6 * 4096, b"x")  # same key written again elsewhere
    report = seg.recover()
    assert [(b.key, b.offset) for b in report.blocks] == [("new", 4096), ("neighbour", 3 * 4096), ("moved", 6 * 4096)]
    assert report.dropped == []
    seg.close()


def test_records_made_during_recovery_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    put(seg, "before", 0, b"one")
    real_read_into = seg.read_into

    def read_into(offset: int, dest: memoryview) -> None:  # a writer journals mid-recovery
        real_read_into(offset, dest)
        put(seg, "during", 4096, b"two")

    monkeypatch.setattr(seg, "read_into", read_into)
    assert [b.key for b in seg.recover().blocks] == ["before"]
    monkeypatch.undo()
    assert [b.key for b in seg.recover().blocks] == ["before", "during"]
    seg.close()


def test_live_records_rules() -> None:
    r = JournalRecord
    assert live_records([r("a", 0, 100, 1), r("b", 4096, 1, 2)], 4096) == [r("a", 0, 100, 1), r("b", 4096, 1, 2)]
    # [0, 4096) reserves a whole page: a block at 0 of any size collides with it
    assert live_records([r("a", 0, 1, 1), r("b", 0, 1, 2)], 4096) == [r("b", 0, 1, 2)]
    # one later record spanning several earlier ones removes them all
    earlier = [r(f"k{i}", i * 4096, 4096, i) for i in range(5)]
    assert live_records([*earlier, r("big", 4096, 3 * 4096, 9)], 4096) == [
        earlier[0],
        r("big", 4096, 3 * 4096, 9),
        earlier[4],
    ]


@pytest.mark.parametrize(
    "tail",
    [
        b"\x07",
        encode(JournalRecord("torn", 0, 1, 2))[:-3],
        b"\xff" * 40,
        encode(JournalRecord("x", 0, 1, 2))[:12] + bytes(30),
    ],
)
def test_torn_journal_tail_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: bytes) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    put(seg, "a", 0, b"first")
    seg.close(remove=False)
    with open(tmp_path / "ssd-0.journal", "ab") as f:
        f.write(tail)

    with caplog.at_level(logging.WARNING):
        seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    assert "torn" in caplog.text
    put(seg, "b", 4096, b"second")  # lands after the last good record, not the garbage
    seg.close(remove=False)

    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    assert [b.key for b in seg.recover().blocks] == ["a", "b"]
    seg.close()


def test_journal_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ssd-0.journal").write_bytes(b"NOTAJRNL" + bytes(100))
    with pytest.raises(ValueError, match="journal"):
        SsdSegment.open(tmp_path, 0, CAPACITY)
    assert (tmp_path / "ssd-0.journal").read_bytes().startswith(b"NOTAJRNL")


def test_journal_torn_at_creation_starts_empty(tmp_path: Path) -> None:
    (tmp_path / "ssd-0.journal").write_bytes(MAGIC[:3])
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    assert seg.recover().blocks == []
    seg.close()


def test_einval_on_direct_write_falls_back_to_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        if fd == seg._direct_fd:  # internal on purpose: only O_DIRECT writes are made to fail
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr("kvstore.storage.ssd.os.pwrite", pwrite)
    blob = os.urandom(MiB + 3)
    seg.write_from(0, memoryview(blob))
    assert not seg.direct
    assert read(seg, 0, len(blob)) == blob
    seg.close()


def test_einval_on_direct_open_falls_back_to_buffered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def fake_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr("kvstore.storage.ssd.os.open", fake_open)
    seg = SsdSegment.open(tmp_path, 0, CAPACITY)
    assert not seg.direct
    put(seg, "a", 0, b"hello")
    assert seg.recover().blocks[0].key == "a"
    seg.close()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_tmpfs() -> None:
    """tmpfs refuses O_DIRECT on older kernels and takes it on newer ones: either must work."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        seg = SsdSegment.open(Path(d), 0, 8 * MiB)
        for size in SIZES[:5]:
            blob = os.urandom(size)
            put(seg, f"k{size}", 0, blob)
            assert read(seg, 0, size) == blob
        seg.close()


def test_raw_disk_ceiling(tmp_path: Path) -> None:
    ceiling = raw_disk_ceiling(tmp_path, 3 * MiB)
    assert ceiling.size == 8 * MiB
    assert ceiling.buffered_write_gbps > 0 and ceiling.buffered_read_gbps > 0
    assert ceiling.direct_write_gbps and ceiling.direct_read_gbps
    assert not list(tmp_path.iterdir())
