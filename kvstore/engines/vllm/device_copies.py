"""Copies between a paged KV cache and host staging memory, for caches the store cannot read in place.

Transports move host bytes. A CUDA cache is gathered block by block into a device staging buffer,
copied once into pinned host memory, and stored from there; a load lands in pinned host memory and
goes back the same way. The copies run on a side stream of their own, ordered after the work the
engine's stream had queued when they were asked for (`mark`): a save started as a layer finishes
copies that layer's blocks while the next layer computes, and the engine thread never waits for it.

`stand_in=True` runs the same path over a CPU cache: a separate host buffer, no pinning, no stream
(as the GPU tier's `gpu_device=-1`), so the staged path is exercised on a host without a GPU. A CPU
cache without it is gathered straight into the host buffer (one copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

_cuda: Any = torch.cuda  # Stream and Event are untyped: used as Any


class GatherPart(NamedTuple):
    """Bytes [offset, offset + nbytes) of each staged row are block `block_ids[row]` of `plane`."""

    plane: torch.Tensor
    block_ids: torch.Tensor
    offset: int
    nbytes: int


class ScatterPart(NamedTuple):
    """Bytes [offset, offset + nbytes) of staged rows `rows` go to blocks `block_ids` of `plane`."""

    plane: torch.Tensor
    rows: torch.Tensor
    block_ids: torch.Tensor
    offset: int
    nbytes: int


@dataclass
class Staged:
    """Rows gathered for a save: `host` holds them once `done` (an event; None: already)."""

    host: torch.Tensor
    done: Any = None
    device_rows: torch.Tensor | None = None  # kept alive until the copy from it is done
    parts: Sequence[GatherPart] = ()  # their block-id tensors too (used on the side stream)

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()
            self.done = None
        self.device_rows = None
        self.parts = ()


class DeviceCopies:
    def __init__(self, device: torch.device, stand_in: bool = False) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.staged = self.cuda or stand_in  # a separate host buffer (else: gathered into it)
        self._stream: Any = _cuda.Stream(device) if self.cuda else None

    def mark(self) -> Any:
        """An event after everything the calling thread's stream has queued (None on the host)."""
        if not self.cuda:
            return None
        event = _cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    @contextlib.contextmanager
    def _side(self, after: Any) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        # After the caller's own queued work (its block-id tensors) and `after` (the engine's).
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        if after is not None:
            self._stream.wait_event(after)
        with torch.cuda.stream(self._stream):
            yield

    def _record(self) -> Any:
        if self._stream is None:
            return None
        event = _cuda.Event()
        event.record(self._stream)
        return event

    def host_rows(self, rows: int, nbytes: int) -> torch.Tensor:
        return torch.empty(rows, nbytes, dtype=torch.uint8, pin_memory=self.cuda)

    def gather(self, parts: Sequence[GatherPart], rows: int, nbytes: int, after: Any = None) -> Staged:
        """Start copying `parts` into `rows` host rows of `nbytes`; `Staged.wait` before reading."""
        with self._side(after):
            device_rows = torch.empty(rows, nbytes, dtype=torch.uint8, device=self.device)
            for part in parts:
                blocks = part.plane.index_select(0, part.block_ids)
                device_rows[:, part.offset : part.offset + part.nbytes] = blocks.view(torch.uint8).reshape(rows, -1)
            if not self.staged:
                return Staged(device_rows)
            host = self.host_rows(rows, nbytes)
            host.copy_(device_rows, non_blocking=self.cuda)
            return Staged(host, self._record(), device_rows, parts)

    def scatter(self, host: torch.Tensor, parts: Sequence[ScatterPart], after: Any = None) -> None:
        """Copy staged rows into the cache; returns when the blocks hold them."""
        with self._side(after):
            rows = host.to(self.device, non_blocking=True) if self.cuda else host
            for part in parts:
                if len(part.block_ids):
                    data = rows[part.rows, part.offset : part.offset + part.nbytes].view(part.plane.dtype)
                    part.plane.index_copy_(0, part.block_ids, data.reshape(len(part.block_ids), *part.plane.shape[1:]))
            if self._stream is not None:
                self._stream.synchronize()
