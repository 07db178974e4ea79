"""A paged KV cache: fixed-size blocks in per-layer block-major tensors, and their free list.

Layer l is one tensor `[num_blocks, 2, block_size, kv_heads, head_dim]` (K then V per block), so
`layers[l][b]` is one contiguous block of one layer: exactly what the codec moves as an object.
A sequence owns a block table (a list of block ids); position p lives in block table[p // bs],
slot p % bs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Sequence

import torch


class CacheFull(RuntimeError):
    """Not enough free blocks for a sequence: the request is too long for this instance's cache."""


@dataclass(frozen=True)
class CacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


class PagedKVCache:
    """Block storage plus allocator. Allocation is thread safe (a load abandoned at its deadline
    frees its blocks from the loading thread); reads and writes of a sequence's blocks are only
    made by the thread that owns the sequence."""

    def __init__(self, shape: CacheShape) -> None:
        self.shape = shape
        self.layers = [torch.zeros(shape.num_blocks, 2, shape.block_size, shape.num_kv_heads, shape.head_dim,
                                   dtype=shape.dtype) for _ in range(shape.num_layers)]
        self._free = list(range(shape.num_blocks - 1, -1, -1))
        self._used: set[int] = set()
        self._lock = threading.Lock()

    @property
    def num_free(self) -> int:
        with self._lock:
            return len(self._free)

    def allocate(self, n: int) -> list[int]:
        with self._lock:
            if n > len(self._free):
                raise CacheFull(f"need {n} blocks, {len(self._free)} of {self.shape.num_blocks} free")
            ids = [self._free.pop() for _ in range(n)]
            self._used.update(ids)
            return ids

    def free(self, ids: Sequence[int]) -> None:
        with self._lock:
            for b in ids:
                if b not in self._used:
                    raise ValueError(f"block {b} freed twice or never allocated")
                self._used.remove(b)
                self._free.append(b)

    def check_invariants(self) -> None:
        with self._lock:
            assert len(self._free) + len(self._used) == self.shape.num_blocks
            assert not self._used.intersection(self._free)
            assert len(set(self._free)) == len(self._free)

    def _slots(self, table: Sequence[int], start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, start + count)
        bs = self.shape.block_size
        blocks = torch.as_tensor(list(table), dtype=torch.long)[pos // bs]
        return blocks, pos % bs

    def write(self, layer: int, table: Sequence[int], start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store K, V `[count, kv_heads, head_dim]` for positions [start, start+count)."""
        blocks, offsets = self._slots(table, start, k.shape[0])
        self.layers[layer][blocks, 0, offsets] = k
        self.layers[layer][blocks, 1, offsets] = v

    def read(self, layer: int, table: Sequence[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V `[length, kv_heads, head_dim]` of positions [0, length)."""
        n = self.shape.blocks_for(length)
        kv = self.layers[layer][torch.as_tensor(list(table[:n]), dtype=torch.long)]
        shape = (n * self.shape.block_size, self.shape.num_kv_heads, self.shape.head_dim)
        return kv[:, 0].reshape(shape)[:length], kv[:, 1].reshape(shape)[:length]
