"""Eviction policy: names which objects to drop. It frees nothing itself; the store does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from kvstore.meta.index import Entry


class Recency(Protocol):
    """COMPLETE objects in recency order: the whole index, one tenant's (index.TenantRecency), or
    those in some segments (index.SegmentRecency)."""

    def least_recent(self) -> Iterator[tuple[str, Entry]]: ...


class EvictionPolicy(Protocol):
    def victims(self, index: Recency, protected: Callable[[str], bool], bytes_needed: int) -> list[str]:
        """Keys whose removal frees at least `bytes_needed` (fewer if not enough is evictable),
        never one for which protected(key) is true. Does not modify the index. `protected` is
        asked of candidates in the order they are considered, and every candidate it spares not
        is taken (kvstore.meta.quotas counts what it lets through)."""


class LRUEviction:
    """Least recently used first (recency is the index's COMPLETE order)."""

    def victims(self, index: Recency, protected: Callable[[str], bool], bytes_needed: int) -> list[str]:
        chosen: list[str] = []
        freed = 0
        for key, entry in index.least_recent():
            if freed >= bytes_needed:
                break
            if protected(key):
                continue
            chosen.append(key)
            freed += entry.size * len(entry.replicas())
        return chosen
