"""GPU tier: a segment is one CUDA allocation (torch), next to a decode engine.

Transports that cannot address device memory stage through host memory: `read_into` copies
device -> caller buffer, `write_from` caller buffer -> device, each one cudaMemcpy through a
pinned staging buffer. torch is imported only when a GPU segment is created.
"""

from __future__ import annotations

import threading

from kvstore.errors import Unavailable
from kvstore.storage.base import SegmentStorage
from kvstore.types import Tier

_STAGING = 8 << 20


class GpuSegment(SegmentStorage):
    tier = Tier.GPU

    def __init__(self, segment_id: str, capacity: int, device: int = 0) -> None:
        try:
            import torch
        except ImportError as exc:
            raise Unavailable("a GPU tier needs torch: pip install 'kvstore[torch]' (a CUDA build)") from exc
        if not torch.cuda.is_available() or device >= torch.cuda.device_count():
            raise Unavailable(f"no CUDA device {device} here: drop the GPU tier (--gpu 0) on this host")
        self._torch = torch
        self.segment_id = segment_id
        self.capacity = capacity
        self.device = torch.device("cuda", device)
        self.memory = torch.empty(capacity, dtype=torch.uint8, device=self.device)
        self._staging = torch.empty(_STAGING, dtype=torch.uint8, pin_memory=True)
        self._lock = threading.Lock()    # one staging buffer: copies through it take turns

    @property
    def device_pointer(self) -> int:
        """Base address of the segment in device memory (for transports that register it)."""
        return self.memory.data_ptr()

    def _host(self, buf: memoryview):
        return self._torch.frombuffer(buf, dtype=self._torch.uint8) if len(buf) else None

    def read_into(self, offset: int, dest: memoryview) -> None:
        self._check_range(offset, len(dest))
        with self._lock:
            for start in range(0, len(dest), _STAGING):
                n = min(_STAGING, len(dest) - start)
                stage = self._staging[:n]
                stage.copy_(self.memory[offset + start:offset + start + n])
                self._host(dest[start:start + n]).copy_(stage)

    def write_from(self, offset: int, src: memoryview) -> None:
        self._check_range(offset, len(src))
        with self._lock:
            for start in range(0, len(src), _STAGING):
                n = min(_STAGING, len(src) - start)
                stage = self._staging[:n]
                stage.copy_(self._host(src[start:start + n]))
                self.memory[offset + start:offset + start + n].copy_(stage)
            self._torch.cuda.synchronize(self.device)

    def close(self, remove: bool = True) -> None:
        self.memory = None
        self._staging = None
