"""How many copies of each block each tier holds, so a block is announced in a tier when its first
copy arrives there and withdrawn when its last one leaves.

MetaState reports replicas, not blocks: a key copied to a second DRAM daemon is "stored in DRAM"
twice, and losing one of the two is "removed from DRAM" while the other still serves it; the
parts of a per-layer block (`{block}/{part}`) arrive and leave one by one. Counting (replica,
part) copies per (block, tier) turns that into exact transitions. A removal of a block the count
never saw (after a reset) is ignored, as consumers of vLLM's events ignore removals of unknown
hashes.

Memory: one dict entry per block (its key is the store key itself, shared, unless the block has
parts), the three tiers' counts packed into one int.
"""

from __future__ import annotations

from kvstore.types import Tier

_BITS = 21
_MASK = (1 << _BITS) - 1
SHIFT = {Tier.GPU: 0, Tier.DRAM: _BITS, Tier.SSD: 2 * _BITS}  # a tier's count, in the packed int


class Holdings:
    """`shift` is SHIFT[tier], looked up once per batch of keys by the caller."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def add(self, block: str, shift: int) -> bool:
        """One more copy of `block` in the tier; True if it is the first there."""
        packed = self._counts.get(block, 0)
        count = (packed >> shift) & _MASK
        if count < _MASK:  # saturates rather than spill into the next tier's count
            self._counts[block] = packed + (1 << shift)
        return count == 0

    def remove(self, block: str, shift: int) -> bool:
        """One copy fewer; True if that was the last one in the tier."""
        packed = self._counts.get(block, 0)
        count = (packed >> shift) & _MASK
        if count == 0:
            return False
        packed -= 1 << shift
        if packed:
            self._counts[block] = packed
        else:
            del self._counts[block]
        return count == 1

    def tiers(self, block: str) -> list[Tier]:
        packed = self._counts.get(block, 0)
        return [tier for tier, shift in SHIFT.items() if (packed >> shift) & _MASK]

    def clear(self) -> None:
        self._counts.clear()

    def __len__(self) -> int:
        return len(self._counts)
