"""A paged KV cache: fixed-size blocks in per-layer block-major tensors, and their free list.

Layer l is one tensor `[num_blocks, 2, block_size, kv_heads, head_dim]` (K then V per block), so
`layers[l][b]` is one contiguous block of one layer: exactly what the codec moves as an object.
A sequence owns a block table (a list of block ids); position p lives in block table[p // bs],
slot p % bs.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Chunk:
    """Positions [start, start + len(tokens)) of one sequence, whose KV lives in blocks `table`."""

    tokens: Sequence[int]
    start: int
    table: Sequence[int]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


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
    """Block storage plus allocator. A block a transfer is reading or writing is *pinned*: freeing
    it only releases it, and it returns to the free list when its last pin goes, so late bytes of
    an abandoned load, or a save still reading, never meet another sequence's KV. Allocation,
    pins and frees are thread safe; a sequence's blocks are read and written by one thread (the
    engine's) or by the one transfer that pins them."""

    def __init__(self, shape: CacheShape) -> None:
        self.shape = shape
        self.layers = [
            torch.zeros(shape.num_blocks, 2, shape.block_size, shape.num_kv_heads, shape.head_dim, dtype=shape.dtype)
            for _ in range(shape.num_layers)
        ]
        self._free = list(range(shape.num_blocks - 1, -1, -1))
        self._used: set[int] = set()
        self._pins: Counter[int] = Counter()
        self._released: set[int] = set()  # freed while pinned: free once unpinned
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
        """Give blocks back; a pinned one goes back when it is unpinned."""
        with self._lock:
            for b in ids:
                if b not in self._used or b in self._released:
                    raise ValueError(f"block {b} freed twice or never allocated")
                if self._pins[b]:
                    self._released.add(b)
                else:
                    self._used.remove(b)
                    self._free.append(b)

    def pin(self, ids: Sequence[int]) -> None:
        with self._lock:
            for b in ids:
                if b not in self._used or b in self._released:
                    raise ValueError(f"block {b} pinned but not allocated")
                self._pins[b] += 1

    def unpin(self, ids: Sequence[int]) -> None:
        with self._lock:
            for b in ids:
                if self._pins[b] <= 0:
                    raise ValueError(f"block {b} unpinned but not pinned")
                self._pins[b] -= 1
                if not self._pins[b]:
                    del self._pins[b]
                    if b in self._released:
                        self._released.remove(b)
                        self._used.remove(b)
                        self._free.append(b)

    def check_invariants(self) -> None:
        with self._lock:
            assert len(self._free) + len(self._used) == self.shape.num_blocks
            assert not self._used.intersection(self._free)
            assert len(set(self._free)) == len(self._free)
            assert set(self._pins) <= self._used and self._released <= set(self._pins)

    def slots(self, chunks: Sequence[Chunk]) -> tuple[torch.Tensor, torch.Tensor]:
        """(block id, offset in block) of every position of every chunk, in order."""
        bs = self.shape.block_size
        blocks, offsets = [], []
        for ch in chunks:
            pos = torch.arange(ch.start, ch.end)
            blocks.append(torch.as_tensor(list(ch.table), dtype=torch.long)[pos // bs])
            offsets.append(pos % bs)
        return torch.cat(blocks), torch.cat(offsets)

    def write_slots(
        self, layer: int, slots: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store K, V `[positions, kv_heads, head_dim]` at `slots` (from `slots`)."""
        blocks, offsets = slots
        self.layers[layer][blocks, 0, offsets] = k
        self.layers[layer][blocks, 1, offsets] = v

    def gather(self, layer: int, tables: Sequence[Sequence[int]], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V, each `[len(tables), kv_heads, L, head_dim]` and contiguous, of positions [0, L)
        of each table, L being `length` rounded up to whole blocks. Positions past a sequence's
        own end hold whatever its blocks (or, past its table, block 0) hold: the caller masks
        them. One gather and one transposing copy, whatever the batch."""
        n = self.shape.blocks_for(length)
        ids = torch.zeros(len(tables), n, dtype=torch.long)
        for row, table in enumerate(tables):
            own = list(table[:n])
            ids[row, : len(own)] = torch.as_tensor(own, dtype=torch.long)
        b, bs, heads, dim = len(tables), self.shape.block_size, self.shape.num_kv_heads, self.shape.head_dim
        kv = self.layers[layer].index_select(0, ids.view(-1)).view(b, n, 2, bs, heads, dim)
        kv = kv.permute(2, 0, 4, 1, 3, 5).reshape(2, b, heads, n * bs, dim)
        return kv[0], kv[1]
