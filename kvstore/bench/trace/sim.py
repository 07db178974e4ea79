"""Simulated prefix caches of whole blocks, driven as the replay drives the store: per request,
`match` the leading blocks held, `load` them (a read: most recently used), `store` the rest (a
block already held is not rewritten and its recency is left as it was, as kvstore's and Mooncake's
put of an existing key leave it).

    InfiniteCache  every block ever stored: the bound no eviction policy can pass
    LRUCache       exact least-recently-used at a capacity in blocks: O(1) a block (OrderedDict)

Every policy is a PrefixCache; `simulate` runs any of them (the candidates: policies.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvstore.bench.trace.format import Request


class PrefixCache(Protocol):
    evictions: int

    def match(self, blocks: Sequence[Hashable]) -> int:
        """How many leading `blocks` are held. Changes nothing."""

    def load(self, blocks: Sequence[Hashable]) -> None:
        """A read of these held blocks, in order: each becomes the most recently used."""

    def store(self, blocks: Sequence[Hashable]) -> None:
        """Hold these blocks (in order), evicting as the policy says; held ones are left as they are."""

    def __len__(self) -> int: ...


class InfiniteCache:
    def __init__(self) -> None:
        self._held: set[Hashable] = set()
        self.evictions = 0

    def match(self, blocks: Sequence[Hashable]) -> int:
        n = 0
        for block in blocks:
            if block not in self._held:
                break
            n += 1
        return n

    def load(self, blocks: Sequence[Hashable]) -> None:
        pass

    def store(self, blocks: Sequence[Hashable]) -> None:
        self._held.update(blocks)

    def __len__(self) -> int:
        return len(self._held)


class LRUCache:
    """Exact LRU over at most `capacity` blocks; the OrderedDict's order is recency, oldest first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be at least 0 blocks")
        self.capacity = capacity
        self._held: OrderedDict[Hashable, None] = OrderedDict()
        self.evictions = 0

    def match(self, blocks: Sequence[Hashable]) -> int:
        n = 0
        for block in blocks:
            if block not in self._held:
                break
            n += 1
        return n

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            self._held.move_to_end(block)

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            if block in self._held:
                continue
            self._held[block] = None
            if len(self._held) > self.capacity:
                self._held.popitem(last=False)
                self.evictions += 1

    def __len__(self) -> int:
        return len(self._held)

    def check_invariants(self) -> None:
        assert len(self._held) <= self.capacity, f"{len(self._held)} blocks held over a capacity of {self.capacity}"


@dataclass(frozen=True)
class SimResult:
    hit_tokens: tuple[int, ...]  # per request: prompt tokens found in the cache
    evictions: int
    held_blocks: int  # at the end

    @property
    def total_hit_tokens(self) -> int:
        return sum(self.hit_tokens)


def step(cache: PrefixCache, request: Request) -> int:
    """One request against `cache`: the prompt tokens it hits."""
    blocks = request.hash_ids
    hit = cache.match(blocks)
    cache.load(blocks[:hit])
    cache.store(blocks[hit:])
    return request.tokens_in(hit)


def simulate(requests: Sequence[Request], cache: PrefixCache) -> SimResult:
    hits = tuple(step(cache, r) for r in requests)
    return SimResult(hits, cache.evictions, len(cache))
