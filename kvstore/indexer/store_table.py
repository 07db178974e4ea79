"""The store's own blocks, per key namespace ({tenant}/{model}/{layout}): inside the metadata
service a FeedListener on its block feed (kvstore/events/feed.py), so it changes in the store's
order a few milliseconds behind it; elsewhere (the router) fed from kvstore's KV events by
StoreEvents (store_events.py).

Only engine block keys are indexed (kvstore/events/block_ids.py): other keys name no prefix.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from urllib.parse import quote

from kvstore.events.feed import Transition
from kvstore.indexer import media
from kvstore.indexer.table import HashTable, Match


class StoreTable:
    def __init__(self) -> None:
        self._tables: dict[str, HashTable] = {}
        self._lock = threading.Lock()

    def changed(self, transitions: Sequence[Transition]) -> None:
        with self._lock:
            for t in transitions:
                if t.ref.namespace is not None:
                    self._apply(t.stored, t.ref.namespace, t.ref.hash, media.bit(media.TIER_MEDIUM[t.tier]))

    def apply(self, stored: bool, namespace: str, block_hash: int, medium: str) -> None:
        """One block entered (stored) or left a (normalized) medium."""
        bit = media.bit(medium)
        with self._lock:
            self._apply(stored, namespace, block_hash, bit)

    def _apply(self, stored: bool, namespace: str, block_hash: int, bit: int) -> None:
        if stored:
            self._tables.setdefault(namespace, HashTable()).add(block_hash, bit)
            return
        table = self._tables.get(namespace)
        if table is not None and table.remove(block_hash, bit) and not table:
            del self._tables[namespace]

    def cleared(self) -> None:
        with self._lock:
            self._tables.clear()

    def match(self, tenant: str, model: str, hashes: Sequence[int], layout: str | None = None) -> Match:
        """The longest prefix of `hashes` held under one of the (tenant, model) namespaces (or
        the one with `layout`): blocks of different layouts are different caches."""
        prefix = f"{quote(tenant, safe='')}/{quote(model, safe='')}/"
        exact = None if layout is None else prefix + quote(layout, safe="")
        best = Match.none()
        with self._lock:
            for namespace, table in self._tables.items():
                if namespace == exact or (exact is None and namespace.startswith(prefix)):
                    found = table.match(hashes)
                    if found.better(best):
                        best = found
        return best

    def namespaces(self) -> list[str]:
        with self._lock:
            return list(self._tables)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(t) for t in self._tables.values())
