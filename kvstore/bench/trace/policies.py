"""Candidate eviction policies for the prefix cache (issue 27, part 3), as PrefixCaches (sim.py)
at a capacity in blocks, each O(1) amortized a block. The study (study.py) ranks them against
the exact LRU and the bounds on the public traces; docs/traces.md has the table.

    PrefixLRU    LRU that keeps a chain's head more recent than its tail: a request's blocks are
                 used tail first, so of one chain the later blocks (useless once the head is
                 gone) are evicted first.
    ProbationLRU two segments (SLRU): a block stored enters `probation`; a read moves it to the
                 protected LRU (capped at its share, its oldest demoted back to probation).
                 Probation is evicted first; both are walked tail first as PrefixLRU's. Blocks
                 stored once and never read (three quarters of the conversation trace's) leave
                 before any block that was reused.
    S3FIFO       a small FIFO for new blocks, a main FIFO with a 2-bit use count (reinserted while
                 used), a ghost FIFO of the small one's evictions (Yang et al., SOSP'23).
    Sieve        one FIFO with a visited bit and a moving hand (Zhang et al., NSDI'24).
    TinyLFU      PrefixLRU behind a frequency filter: a new block is admitted only if a count-min sketch
                 (halved every 10 x capacity uses) counts it at least as often as the LRU victim.

The store's own ARC, driven as the store drives it, is in arcsim.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class Held:
    """Shared parts: the match (a lookup changes nothing) and the capacity check."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1 block")
        self.capacity = capacity
        self.evictions = 0

    def _holds(self, block: Hashable) -> bool:
        raise NotImplementedError

    def match(self, blocks: Sequence[Hashable]) -> int:
        n = 0
        for block in blocks:
            if not self._holds(block):
                break
            n += 1
        return n

    def check_invariants(self) -> None:
        assert len(self) <= self.capacity, f"{len(self)} blocks held over a capacity of {self.capacity}"  # type: ignore[arg-type]


class PrefixLRU(Held):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._held: OrderedDict[Hashable, None] = OrderedDict()

    def _holds(self, block: Hashable) -> bool:
        return block in self._held

    def __len__(self) -> int:
        return len(self._held)

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in reversed(blocks):
            self._held.move_to_end(block)

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in reversed(blocks):
            if block in self._held:
                continue
            self._held[block] = None
            if len(self._held) > self.capacity:
                self._held.popitem(last=False)
                self.evictions += 1


class ProbationLRU(Held):
    """`probation` (new blocks) and `protected` (read at least once), each oldest first."""

    def __init__(self, capacity: int, protected_share: float = 0.8) -> None:
        super().__init__(capacity)
        self.protected_cap = int(capacity * protected_share)
        self._probation: OrderedDict[Hashable, None] = OrderedDict()
        self._protected: OrderedDict[Hashable, None] = OrderedDict()

    def _holds(self, block: Hashable) -> bool:
        return block in self._probation or block in self._protected

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in reversed(blocks):
            if self._probation.pop(block, 0) is None:
                self._protected[block] = None
            else:
                self._protected.move_to_end(block)
        while len(self._protected) > self.protected_cap:  # demoted, as the most recent of probation
            self._probation[self._protected.popitem(last=False)[0]] = None

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in reversed(blocks):
            if self._holds(block):
                continue
            self._probation[block] = None
            if len(self) > self.capacity:
                (self._probation or self._protected).popitem(last=False)
                self.evictions += 1


class S3FIFO(Held):
    def __init__(self, capacity: int, small_share: float = 0.1) -> None:
        super().__init__(capacity)
        self.small_cap = max(1, int(capacity * small_share))
        self._small: OrderedDict[Hashable, None] = OrderedDict()
        self._main: OrderedDict[Hashable, None] = OrderedDict()
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._freq: dict[Hashable, int] = {}

    def _holds(self, block: Hashable) -> bool:
        return block in self._freq

    def __len__(self) -> int:
        return len(self._freq)

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            self._freq[block] = min(3, self._freq[block] + 1)

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            if block in self._freq:
                continue
            while len(self._freq) >= self.capacity:
                self._evict()
            if self._ghost.pop(block, 0) is None:
                self._main[block] = None
            else:
                self._small[block] = None
            self._freq[block] = 0

    def _evict(self) -> None:
        if len(self._small) >= self.small_cap or not self._main:
            while self._small:
                block, _ = self._small.popitem(last=False)
                if self._freq[block] > 0:
                    self._main[block] = None
                    self._freq[block] = 0
                    continue
                del self._freq[block]
                self._ghost[block] = None
                if len(self._ghost) > self.capacity:
                    self._ghost.popitem(last=False)
                self.evictions += 1
                return
        while self._main:
            block, _ = self._main.popitem(last=False)
            if self._freq[block] > 0:
                self._freq[block] -= 1
                self._main[block] = None
                continue
            del self._freq[block]
            self.evictions += 1
            return


class Sieve(Held):
    """The FIFO is a dict oldest first; the hand walks it from the oldest, keeping visited blocks
    (clearing the bit) and evicting the first unvisited one."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._visited: dict[Hashable, bool] = {}
        self._queue: OrderedDict[Hashable, None] = OrderedDict()  # the hand is its front

    def _holds(self, block: Hashable) -> bool:
        return block in self._visited

    def __len__(self) -> int:
        return len(self._visited)

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            self._visited[block] = True

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            if block in self._visited:
                continue
            while len(self._visited) >= self.capacity:
                old, _ = self._queue.popitem(last=False)
                if self._visited[old]:
                    self._visited[old] = False
                    self._queue[old] = None  # behind the hand: looked at again after a full turn
                    continue
                del self._visited[old]
                self.evictions += 1
            self._visited[block] = False
            self._queue[block] = None


class TinyLFU(PrefixLRU):
    """PrefixLRU whose stores pass a frequency filter (a count-min sketch of 4 rows)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._width = 1 << max(4, (4 * capacity).bit_length())
        self._rows = [[0] * self._width for _ in range(4)]
        self._seen = 0

    def _count(self, block: Hashable) -> int:
        h = hash(block)
        return min(row[(h >> (8 * i)) % self._width] for i, row in enumerate(self._rows))

    def _add(self, block: Hashable) -> None:
        h = hash(block)
        for i, row in enumerate(self._rows):
            row[(h >> (8 * i)) % self._width] += 1
        self._seen += 1
        if self._seen >= 10 * self.capacity:
            self._seen = 0
            for row in self._rows:
                row[:] = [c >> 1 for c in row]

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            self._add(block)
        super().load(blocks)

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in reversed(blocks):
            if block in self._held:
                continue
            self._add(block)
            if len(self._held) >= self.capacity:
                victim = next(iter(self._held))
                if self._count(block) < self._count(victim):
                    continue  # not admitted
                del self._held[victim]
                self.evictions += 1
            self._held[block] = None
