"""Where a client last found its keys, so that reading one again needs no metadata call.

A read from a cached location is optimistic, seqlock style: the bytes are copied without a read
lease and then validated by the checksum the key was stored with. If the block was evicted,
moved, removed or its space rewritten meanwhile, the check fails (or the transport refuses an
expired grant) and the reader asks the service again; no caller ever gets another key's bytes.
A block removed or evicted whose space was not yet reused still reads back as the key's own
bytes (content addressed: same key, same bytes), for at most the entry's lifetime.

An entry lives until shortly before its grants expire (the service's read-lease TTL), and at
most `ttl_s`; the reader's own removes drop theirs at once. Hits are counted as LRU touches and
handed to the service with the reader's next metadata call (see reader.py), so eviction order
still follows reads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from kvstore.errors import ErrorCode
from kvstore.results import GetResult
from kvstore.types import SegmentInfo

EXPIRY_MARGIN_S = 0.5  # an entry is dropped this long before its grants expire: a read needs time


class Location(NamedTuple):
    result: GetResult  # size, checksum and a read grant per replica (its lease_id is spent: ignore it)
    segments: Mapping[str, SegmentInfo]
    until: float  # time.monotonic() after which the entry is not used


class LocationCache:
    """Bounded (least recently used entries go first); thread safe. capacity 0: disabled."""

    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, Location] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> Location | None:
        """The entry for `key` if it is still good at `now` (time.monotonic())."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.until <= now:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
            return entry

    def put_many(
        self, keys: Sequence[str], results: Sequence[GetResult], segments: Mapping[str, SegmentInfo], now_ms: int
    ) -> None:
        """Remember where the keys of a Get's OK results are: each until shortly before its first
        grant expires (wall clock `now_ms`), and at most ttl_s from now."""
        if not self.capacity:
            return
        mono = time.monotonic()
        margin_ms = now_ms + EXPIRY_MARGIN_S * 1000
        ttl_s, ok = self.ttl_s, ErrorCode.OK
        entries = []
        for key, result in zip(keys, results):
            grants = result.grants
            if result.code is not ok or not grants:
                continue
            # One grant, as most keys have: no generator for the earliest expiry.
            first_ms = grants[0].expires_ms if len(grants) == 1 else min(g.expires_ms for g in grants)
            left_s = (first_ms - margin_ms) / 1000
            if left_s > 0:
                entries.append((key, Location(result, segments, mono + (left_s if left_s < ttl_s else ttl_s))))
        with self._lock:
            for key, entry in entries:
                self._entries[key] = entry
                self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def drop(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
