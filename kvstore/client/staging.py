"""Device tensors (CUDA) as client buffers, staged through pinned host memory.

Every transport moves host bytes (sockets, shared memory, files, registered host memory), so a
value in device memory is copied into a host buffer before a put, and a get lands in one, where its
checksum is verified before the bytes go on to the device: no unverified byte reaches a caller's
tensor. For CUDA the host buffer is pinned (page-locked), so each device copy is one DMA at full
link speed, and a get's copies to the device run on the caller's current stream while the next
chunk's bytes arrive; the call waits for them before it returns.

A call whose device values add up to more than `ClientConfig.staging_bytes` runs in chunks of
about that many bytes (one metadata round trip per chunk), so staging memory stays bounded; a
single value larger than that is staged whole. Pinned buffers come from torch's caching host
allocator, so a chunk's buffer is reused by the next call, not allocated again.

torch is imported only once a device tensor is seen: host buffers take no part in any of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstore.client.buffers import byte_view
from kvstore.errors import InvalidArgument


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "device")


class HostStaging:
    """Decides which buffers are staged and moves their bytes. Holds no state between calls, so it
    is thread safe. `stage_cpu` stages CPU tensors too: the same code path, runnable (and tested)
    on a host without a GPU."""

    def __init__(self, staging_bytes: int, stage_cpu: bool = False) -> None:
        if staging_bytes <= 0:
            raise InvalidArgument(f"staging_bytes must be positive, got {staging_bytes}")
        self.staging_bytes = staging_bytes
        self.stage_cpu = stage_cpu

    def needs(self, obj: Any) -> bool:
        """True for a tensor whose bytes must be staged: one in device memory (or any, with
        stage_cpu)."""
        return _is_tensor(obj) and (self.stage_cpu or obj.device.type != "cpu")

    def sizes(self, objs: Sequence[Any], writable: bool) -> list[int]:
        """Each buffer's size in bytes; InvalidArgument for one that cannot be used (not a
        buffer, not contiguous, read-only where it is written)."""
        return [_flat(obj).numel() if self.needs(obj) else len(byte_view(obj, writable)) for obj in objs]

    def chunks(self, objs: Sequence[Any], sizes: Sequence[int]) -> list[range]:
        """Consecutive index ranges covering `objs`, each staging at most staging_bytes (or one
        value); one range when nothing is staged."""
        out: list[range] = []
        start, staged = 0, 0
        for i, obj in enumerate(objs):
            if not self.needs(obj):
                continue
            if staged and staged + sizes[i] > self.staging_bytes:
                out.append(range(start, i))
                start, staged = i, 0
            staged += sizes[i]
        out.append(range(start, len(objs)))
        return out

    def for_put(self, objs: Sequence[Any]) -> list[memoryview]:
        """Host views of `objs` to write from: staged values are copied device -> host first (the
        copies are finished when this returns)."""
        arena = _Arena(self, objs)
        for i, flat in arena.staged.items():
            arena.slot(i).copy_(flat, non_blocking=arena.pinned)
        arena.wait()
        return arena.views(objs, writable=False)

    def for_get(self, objs: Sequence[Any]) -> StagedGet:
        """Host views for a get to land in; `StagedGet.land` then moves the verified bytes on."""
        return StagedGet(_Arena(self, objs), objs)

    def wait(self, objs: Sequence[Any]) -> None:
        """Block until the device copies `land` started into `objs` are done."""
        _synchronize([o.device for o in objs if self.needs(o) and o.device.type == "cuda"])


class StagedGet:
    """One chunk of a get: `views[i]` is where key i's bytes land."""

    def __init__(self, arena: _Arena, objs: Sequence[Any]) -> None:
        self._arena = arena
        self.views = arena.views(objs, writable=True)

    def land(self, results: Sequence[Any]) -> None:
        """Copy each staged key's bytes (results[i] is its byte count, verified by the reader) from
        host memory into its tensor; keys that failed leave their tensor untouched. CUDA copies are
        queued on the current stream: HostStaging.wait() ends them."""
        for i, flat in self._arena.staged.items():
            n = results[i]
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                flat[:n].copy_(self._arena.slot(i)[:n], non_blocking=self._arena.pinned)


class _Arena:
    """One host buffer holding a slot per staged value of a call, pinned when the values are on a
    CUDA device."""

    def __init__(self, staging: HostStaging, objs: Sequence[Any]) -> None:
        self.staged = {i: _flat(o) for i, o in enumerate(objs) if staging.needs(o)}
        self._offsets: dict[int, int] = {}
        total = 0
        for i, flat in self.staged.items():
            self._offsets[i] = total
            total += flat.numel()
        self.pinned = any(f.device.type == "cuda" for f in self.staged.values())
        self._buffer: Any = None
        if self.staged:
            import torch

            self._buffer = torch.empty(total, dtype=torch.uint8, pin_memory=self.pinned)
            self._devices = [f.device for f in self.staged.values() if f.device.type == "cuda"]

    def slot(self, i: int) -> Any:
        start = self._offsets[i]
        return self._buffer[start : start + self.staged[i].numel()]

    def views(self, objs: Sequence[Any], writable: bool) -> list[memoryview]:
        if not self.staged:
            return [byte_view(o, writable) for o in objs]
        host = memoryview(self._buffer.numpy())
        return [
            host[self._offsets[i] : self._offsets[i] + self.staged[i].numel()]
            if i in self.staged
            else byte_view(o, writable)
            for i, o in enumerate(objs)
        ]

    def wait(self) -> None:
        if self.staged:
            _synchronize(self._devices)


def _flat(t: Any) -> Any:
    """The tensor's bytes as a flat uint8 view (no copy); InvalidArgument unless contiguous."""
    if not t.is_contiguous():
        raise InvalidArgument("tensor is not contiguous: call .contiguous() first")
    import torch

    # detach: a tensor that requires grad is still plain memory to the store
    return t.detach().reshape(-1).view(torch.uint8)


def _synchronize(devices: Sequence[Any]) -> None:
    if not devices:
        return
    import torch

    for device in dict.fromkeys(devices):
        torch.cuda.current_stream(device).synchronize()
