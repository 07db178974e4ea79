"""GPU tier: a segment is one CUDA allocation (torch), next to a decode engine.

Transports move host bytes, so every read and write is staged through pinned host memory: the
segment holds two pinned staging buffers and its own CUDA stream, and copies a range a piece at a
time, the device copy of one piece overlapping the host copy of the one before. A call returns
once its bytes have arrived (a write: in device memory, so any later reader sees them).

`device=-1` puts the segment in host memory instead, with unpinned staging and no stream: the same
code path minus the CUDA calls, so the GPU tier's placement, demotion, promotion and eviction run
end to end on a host without a GPU (tests and the CPU dry run of scripts/device_check.sh; the
daemon logs a warning). torch is imported only when a GPU segment is created.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from kvstore.errors import Unavailable
from kvstore.storage.base import SegmentStorage
from kvstore.types import Tier

log = logging.getLogger(__name__)
_STAGING = 8 << 20
HOST_STAND_IN = -1  # gpu_device value: host memory instead of a CUDA device


class GpuSegment(SegmentStorage):
    tier = Tier.GPU

    def __init__(self, segment_id: str, capacity: int, device: int = 0) -> None:
        try:
            import torch
        except ImportError as exc:
            raise Unavailable(f"a GPU tier needs torch, a CUDA build ({exc}): pip install torch") from exc
        if device == HOST_STAND_IN:
            log.warning("GPU segment %s is a stand-in in host memory (gpu_device=-1): for tests only", segment_id)
            self.device = torch.device("cpu")
        elif device < 0 or not torch.cuda.is_available() or device >= torch.cuda.device_count():
            raise Unavailable(f"no CUDA device {device} here: drop the GPU tier (--gpu 0) on this host")
        else:
            self.device = torch.device("cuda", device)
        self._torch: Any = torch  # untyped in places (Stream, Event): used as Any
        self.segment_id = segment_id
        self.capacity = capacity
        cuda = self.device.type == "cuda"
        self.memory: Any = torch.empty(capacity, dtype=torch.uint8, device=self.device)
        self._stream: Any = self._torch.cuda.Stream(self.device) if cuda else None
        self._staging: list[Any] = [torch.empty(_STAGING, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
        self._host = [memoryview(s.numpy()) for s in self._staging]
        self._lock = threading.Lock()  # the staging buffers: copies through them take turns

    @property
    def device_pointer(self) -> int:
        """Base address of the segment in device memory (for transports that register it)."""
        pointer: int = self.memory.data_ptr()
        return pointer

    def read_into(self, offset: int, dest: memoryview) -> None:
        self._check_range(offset, len(dest))
        pieces = list(range(0, len(dest), _STAGING))
        with self._lock, self._on_stream():
            pending = self._to_host(offset, len(dest), pieces, 0)
            for k, start in enumerate(pieces):
                following = self._to_host(offset, len(dest), pieces, k + 1)  # overlaps the copy below
                self._wait(pending)
                n = min(_STAGING, len(dest) - start)
                dest[start : start + n] = self._host[k % 2][:n]
                pending = following

    def _to_host(self, offset: int, length: int, pieces: list[int], k: int) -> Any:
        """Start the device -> host copy of piece k into staging buffer k % 2; its event (None on
        the host stand-in, whose copy is done on return, and past the last piece)."""
        if k >= len(pieces):
            return None
        start = pieces[k]
        n = min(_STAGING, length - start)
        self._staging[k % 2][:n].copy_(self.memory[offset + start : offset + start + n], non_blocking=True)
        return self._record()

    def write_from(self, offset: int, src: memoryview) -> None:
        self._check_range(offset, len(src))
        with self._lock, self._on_stream():
            last: list[Any] = [None, None]  # per staging buffer: the event of the copy reading it
            for k, start in enumerate(range(0, len(src), _STAGING)):
                n = min(_STAGING, len(src) - start)
                self._wait(last[k % 2])
                self._host[k % 2][:n] = src[start : start + n]
                self.memory[offset + start : offset + start + n].copy_(self._staging[k % 2][:n], non_blocking=True)
                last[k % 2] = self._record()
            if self._stream is not None:
                self._stream.synchronize()

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        with self._torch.cuda.stream(self._stream):
            yield

    def _record(self) -> Any:
        if self._stream is None:
            return None
        event = self._torch.cuda.Event()
        event.record(self._stream)
        return event

    @staticmethod
    def _wait(event: Any) -> None:
        if event is not None:
            event.synchronize()

    def close(self, remove: bool = True) -> None:
        with self._lock:
            self.memory = None
            self._host = []
            self._staging = []
            self._stream = None
