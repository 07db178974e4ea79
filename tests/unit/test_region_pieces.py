"""A batch of small values goes into a region without a grant or a transfer per value: the client
cuts pieces off its region (RegionPool.take_many) and writes them with one check of the region's
grant (Transport.write_pieces), each piece checked only for lying inside it."""

from __future__ import annotations

import os
import time

import pytest

from kvstore.checksum import checksum
from kvstore.client.regions import RegionPool
from kvstore.clock import SystemClock, now_ms
from kvstore.errors import InvalidArgument, PermissionDenied
from kvstore.grant import LOCAL
from kvstore.hostid import host_id
from kvstore.metrics.client import ClientMetrics, MeteredTransport
from kvstore.server.local import LocalMeta
from kvstore.transport.base import Transport
from kvstore.transport.shm import ShmTransport
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo, Tier
from kvstore.wire.calls import Get, PutCommit
from tests.inprocess import InProcessStore
from tests.kernel import populate_supported

SIZE = 1 << 20


@pytest.fixture
def segment(tmp_path):
    path = os.path.join("/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path), f"kvstore-pieces-{os.getpid()}")
    with open(path, "wb") as f:
        f.truncate(SIZE)
    yield SegmentInfo("seg", "d1", Tier.DRAM, SIZE, (Endpoint("shm", f"{host_id()}|{os.getpid()}|{path}"),))
    os.unlink(path)


@pytest.fixture
def shm():
    t = ShmTransport()
    yield t
    t.close()


def region(start: int = 4096, length: int = 64 << 10, expires_ms: int = 0, mode: GrantMode = GrantMode.WRITE) -> Grant:
    return Grant("seg", start, length, mode, expires_ms or now_ms(SystemClock()) + 60_000, b"m" * 16, LOCAL)


def file_bytes(segment: SegmentInfo, offset: int, n: int) -> bytes:
    with open(segment.endpoints[0].address.split("|", 2)[2], "rb") as f:
        f.seek(offset)
        return f.read(n)


@pytest.mark.parametrize("how", ["pieces", "transfers", "metered"])
def test_pieces_land_at_their_offsets_with_their_checksums(segment, shm, how):
    """The shm transport's own write_pieces, the base class's (a transfer per piece, for any other
    transport) and the metered wrapper's agree."""
    values = [os.urandom(100), os.urandom(3000), os.urandom(4096)]
    pieces = [(4096, memoryview(values[0])), (4096 + 128, memoryview(values[1])), (8192 + 64, memoryview(values[2]))]
    deadline = time.monotonic() + 5
    if how == "pieces":
        written = shm.write_pieces(segment, region(), pieces, deadline)
    elif how == "transfers":
        written = Transport.write_pieces(shm, segment, region(), pieces, deadline)
    else:
        metrics = ClientMetrics(SystemClock())
        written = MeteredTransport(shm, metrics).write_pieces(segment, region(), pieces, deadline)
        [timed] = metrics._transfers.values()
        assert timed.bytes == sum(map(len, values))
    assert written.checksums == [checksum(v) for v in values]
    assert [file_bytes(segment, o, len(v)) for (o, _), v in zip(pieces, values, strict=True)] == values


@pytest.mark.parametrize("offset", [4096 - 64, 4096 + (64 << 10) - 64])
def test_a_piece_outside_its_grant_is_refused(segment, shm, offset):
    with pytest.raises(InvalidArgument, match="outside its grant"):
        shm.write_pieces(segment, region(), [(offset, memoryview(bytes(128)))], time.monotonic() + 5)
    assert file_bytes(segment, offset, 128) == bytes(128)


def test_a_grant_past_its_expiry_for_another_direction_or_beyond_the_segment_is_refused(segment, shm):
    piece = [(4096, memoryview(b"x" * 64))]
    deadline = time.monotonic() + 5
    with pytest.raises(PermissionDenied, match="expired"):
        shm.write_pieces(segment, region(expires_ms=now_ms(SystemClock()) - 1), piece, deadline)
    with pytest.raises(InvalidArgument):
        shm.write_pieces(segment, region(mode=GrantMode.READ), piece, deadline)
    with pytest.raises(PermissionDenied, match="outside the segment"):
        shm.write_pieces(segment, region(length=SIZE), piece, deadline)
    assert file_bytes(segment, 4096, 64) == bytes(64)


def test_take_many_cuts_aligned_pieces_and_a_batch_goes_in_with_one_commit():
    with InProcessStore(dram_size=64 << 20, segment_size=16 << 20) as store:
        meta = LocalMeta(store.meta.handlers)
        pool = RegionPool(meta, "c1", host_id(), 1 << 20, 64 << 10, SystemClock())  # type: ignore[arg-type]
        values = [os.urandom(n) for n in (100, 64, 65, 5000)] + [b"big" * 30_000] + [os.urandom(10)]
        pieces = pool.take_many([len(v) for v in values])
        assert pieces[4] is None  # over region_value_max: PutStart
        taken = [p for p in pieces if p is not None]
        r = taken[0].region
        assert all(p.region is r for p in taken)
        assert [p.offset - r.grant.offset for p in taken] == [0, 128, 192, 320, 5376]  # 64-byte aligned
        assert r.inflight == 5 and r.cursor == r.grant.offset + 5440
        shm = ShmTransport()
        try:
            idx = [i for i, p in enumerate(pieces) if p is not None]
            views = [(pieces[i].offset, memoryview(values[i])) for i in idx]  # type: ignore[union-attr]
            done = shm.write_pieces(r.segment, r.grant, views, time.monotonic() + 5)
            keys = [f"k{i}" for i in idx]
            results = meta.call(
                PutCommit(
                    "c1", r.region_id, keys, [o for o, _ in views], [len(values[i]) for i in idx], done.checksums or []
                )
            )
            assert [x.code.name for x in results] == ["OK"] * 5
            pool.done(taken)
            got = meta.call(Get(keys)).results
            assert [(g.size, g.checksum) for g in got] == [(len(values[i]), checksum(values[i])) for i in idx]
        finally:
            shm.close()


def test_a_batch_that_fills_its_region_goes_on_in_a_new_one():
    with InProcessStore(dram_size=64 << 20, segment_size=16 << 20) as store:
        pool = RegionPool(LocalMeta(store.meta.handlers), "c1", host_id(), 1 << 20, 64 << 10, SystemClock())  # type: ignore[arg-type]
        pieces = pool.take_many([64 << 10] * 5)  # the first region is REGION_MIN (256 KiB): four fit
        first, second = pieces[0].region, pieces[4].region  # type: ignore[union-attr]
        assert first is not second and all(p is not None and p.region is first for p in pieces[:4])
        assert first.retired and pool.take_released() == []  # retired, but pieces are in flight
        pool.done([p for p in pieces if p is not None])
        assert pool.take_released() == [first.region_id]


@pytest.mark.skipif(not populate_supported(), reason="MADV_POPULATE_WRITE needs Linux 5.14")
def test_the_pages_of_a_batch_are_mapped_for_writing_in_one_call(segment, shm):
    """Not a page fault per value at its first copy: the span of the batch's pieces is populated
    once (MADV_POPULATE_WRITE), and nothing outside it."""
    pieces = [(4096 + n * 4096, memoryview(os.urandom(4096))) for n in range(8)]
    shm.write_pieces(segment, region(), pieces, time.monotonic() + 5)
    mapped = shm._open["seg"].mapped
    assert mapped is not None and mapped[1:9] == b"\2" * 8 and mapped.count(b"\0") == len(mapped) - 8


@pytest.mark.parametrize("how", ["pieces", "transfers"])
def test_a_piece_is_its_bytes_not_its_first_dimension(segment, shm, how):
    value = os.urandom(128)
    piece = [(4096, memoryview(value).cast("B", (2, 64)))]
    write = shm.write_pieces if how == "pieces" else lambda *a: Transport.write_pieces(shm, *a)
    assert write(segment, region(), piece, time.monotonic() + 5).checksums == [checksum(value)]
    assert file_bytes(segment, 4096, 128) == value
