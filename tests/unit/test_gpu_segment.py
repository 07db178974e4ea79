"""The GPU tier's storage; runs only where CUDA is present."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def test_round_trip_through_device_memory():
    from kvstore.storage.gpu import GpuSegment

    seg = GpuSegment("gpu-test", 64 << 20)
    data = np.random.default_rng(0).integers(0, 256, (20 << 20) + 7, dtype=np.uint8)
    seg.write_from(4096, memoryview(data))
    out = np.zeros_like(data)
    seg.read_into(4096, memoryview(out))
    assert np.array_equal(out, data)
    with pytest.raises(ValueError):
        seg.read_into(64 << 20, memoryview(bytearray(1)))
    seg.close()


def test_no_cuda_is_a_clear_error(monkeypatch):
    import torch

    from kvstore.errors import Unavailable
    from kvstore.storage.gpu import GpuSegment

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Unavailable, match="no CUDA device"):
        GpuSegment("gpu-none", 1 << 20)
