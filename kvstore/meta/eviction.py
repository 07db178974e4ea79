"""Eviction policy: names which objects to drop. It frees nothing itself; the store does.

The seam (`--eviction`, MetaConfig.eviction; docs/traces.md has the study that chose the default):

    lru  least recently used first, by the index's own recency (no state of its own)
    arc  ARC (eviction_arc.py): keys stored and never read since leave before keys read again,
         the split between the two adapting to what comes back

Each tier may name its own (`--eviction dram=lru,ssd=arc`; tierpolicy.py). A policy that keeps
its own order (ARC) is one of the index's watchers: it hears of every COMPLETE key the index adds,
uses (a read or a touch) and removes, in O(1) each, under the store's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvstore.config.meta import EVICTIONS
from kvstore.errors import InvalidArgument
from kvstore.meta.eviction_arc import ARCEviction
from kvstore.meta.index import ObjectIndex, Scope

POLICIES = EVICTIONS


Recency = Scope  # the name it had


class EvictionPolicy(Protocol):
    def victims(self, index: Scope, protected: Callable[[str], bool], bytes_needed: int) -> list[str]:
        """Keys whose removal frees at least `bytes_needed` (fewer if not enough is evictable),
        never one for which protected(key) is true. Does not modify the index. `protected` is
        asked of candidates in the order they are considered, and every candidate it spares not
        is taken (kvstore.meta.quotas counts what it lets through)."""


class LRUEviction:
    """Least recently used first (recency is the index's COMPLETE order)."""

    def victims(self, index: Scope, protected: Callable[[str], bool], bytes_needed: int) -> list[str]:
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


def make_policy(name: str) -> EvictionPolicy:
    """The policy `--eviction NAME` names; InvalidArgument for another name."""
    if name == "lru":
        return LRUEviction()
    if name == "arc":
        return ARCEviction()
    raise InvalidArgument(f"eviction policy {name!r}: one of {', '.join(POLICIES)}")


def check(policy: EvictionPolicy, index: ObjectIndex) -> None:
    """The policy's own order agrees with the index (ARC's lists hold exactly its keys)."""
    if isinstance(policy, ARCEviction):
        policy.check(lambda: (k for k, _ in index.least_recent()), len(index))
