"""The GPU tier's storage: on a CUDA device where one is (marked gpu), and as its host-memory
stand-in (gpu_device=-1) everywhere, through the same piecewise staging code."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvstore.errors import Unavailable  # noqa: E402
from kvstore.storage.base import copy_between  # noqa: E402
from kvstore.storage.dram import DramSegment  # noqa: E402
from kvstore.storage.gpu import _STAGING, HOST_STAND_IN, GpuSegment  # noqa: E402

MIB = 1 << 20


@pytest.fixture(params=[pytest.param(0, marks=pytest.mark.gpu, id="cuda"), pytest.param(HOST_STAND_IN, id="host")])
def seg(request):
    s = GpuSegment("gpu-test", 64 * MIB, request.param)
    yield s
    s.close()


def data(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


@pytest.mark.parametrize("size", [1, 4095, _STAGING, _STAGING + 1, 2 * _STAGING + 7, 20 * MIB + 7])
def test_round_trip_through_device_memory(seg, size):
    src = data(size, size)
    seg.write_from(4096, src.data)
    out = np.zeros_like(src)
    seg.read_into(4096, out.data)
    assert np.array_equal(out, src)
    assert seg.memory[4096 : 4096 + size].cpu().numpy().tobytes() == src.tobytes()  # really in the segment


def test_writes_from_read_only_buffers_and_neighbours_intact(seg):
    seg.write_from(0, memoryview(b"\x01" * 1000))
    seg.write_from(1000, memoryview(bytes(data(3 * MIB, 1))))
    out = bytearray(1000)
    seg.read_into(0, memoryview(out))
    assert out == b"\x01" * 1000


def test_ranges_outside_the_segment_are_refused(seg):
    with pytest.raises(ValueError, match="outside segment"):
        seg.read_into(64 * MIB, memoryview(bytearray(1)))
    with pytest.raises(ValueError, match="outside segment"):
        seg.write_from(64 * MIB - 10, memoryview(bytes(11)))
    assert seg.view(0, 10) is None  # never a host view: transports stage


def test_copies_between_gpu_and_dram_segments(seg, tmp_path):
    """What the daemon's mover does for a GPU -> DRAM demotion and a DRAM -> GPU promotion."""
    dram = DramSegment("dram-test", 32 * MIB, str(tmp_path))
    try:
        src = data(9 * MIB + 3, 2)
        seg.write_from(256, src.data)
        copy_between(seg, 256, dram, 64, len(src))
        assert dram.view(64, len(src)).tobytes() == src.tobytes()
        copy_between(dram, 64, seg, 16 * MIB, len(src))
        out = np.zeros_like(src)
        seg.read_into(16 * MIB, out.data)
        assert np.array_equal(out, src)
    finally:
        dram.close()


def test_concurrent_readers_and_writers_take_turns(seg):
    import threading

    errors = []

    def worker(n: int) -> None:
        try:
            src = data(3 * MIB + n, n)
            for _ in range(3):
                seg.write_from(n * 8 * MIB, src.data)
                out = np.zeros_like(src)
                seg.read_into(n * 8 * MIB, out.data)
                assert np.array_equal(out, src)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_no_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Unavailable, match="no CUDA device"):
        GpuSegment("gpu-none", MIB)
    with pytest.raises(Unavailable, match="no CUDA device -2"):
        GpuSegment("gpu-bad", MIB, -2)
