"""Block hash -> the media that hold it, and the longest cached prefix of a hash chain.

Not thread safe: its owner (StoreTable, EngineCache) locks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvstore.indexer import media


class Match(NamedTuple):
    blocks: int  # leading blocks held in some medium (not necessarily all in one)
    by_medium: dict[str, int]  # leading blocks held in each medium

    @classmethod
    def none(cls) -> Match:
        return cls(0, {})

    def better(self, other: Match) -> bool:
        return self.blocks > other.blocks


class HashTable:
    def __init__(self) -> None:
        self._masks: dict[int, int] = {}

    def add(self, block_hash: int, bit: int) -> None:
        self._masks[block_hash] = self._masks.get(block_hash, 0) | (1 << bit)

    def remove(self, block_hash: int, bit: int) -> bool:
        """Withdraw one medium; True if the block is in none any more. Unknown hashes are ignored."""
        mask = self._masks.get(block_hash, 0) & ~(1 << bit)
        if mask:
            self._masks[block_hash] = mask
            return False
        self._masks.pop(block_hash, None)
        return True

    def holds(self, block_hash: int) -> bool:
        return block_hash in self._masks

    def match(self, hashes: Sequence[int]) -> Match:
        """How many of the leading `hashes` are held, in any medium and in each."""
        blocks = 0
        unbroken = -1  # media that held every block so far
        counts: dict[int, int] = {}
        for i, h in enumerate(hashes):
            mask = self._masks.get(h, 0)
            if not mask:
                break
            blocks = i + 1
            unbroken &= mask
            b = 0
            rest = unbroken
            while rest:
                if rest & 1:
                    counts[b] = i + 1
                rest >>= 1
                b += 1
        return Match(blocks, {media.name(b): n for b, n in counts.items()})

    def clear(self) -> None:
        self._masks.clear()

    def __len__(self) -> int:
        return len(self._masks)
