"""Orders over the COMPLETE keys besides the index's own recency, kept as keys come and go, so
that a caller walks only what it returns (never every key, under the store's lock):

- per tenant (namespaced keys), least recently used first: a tenant at its quota evicts its own
  oldest blocks without stepping over every other tenant's;
- byte order: a ListKeys page costs O(log n + its keys), and paging a store is linear, not
  quadratic;
- per segment, least recently used first (SegmentOrders): demotion, SSD room and the watermarks
  walk only the keys in the segments they free, not the keys every other segment holds.

The default tenant's keys (no namespace) have no order of their own: its quota, if any, walks
the global recency, skipping the others' keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from itertools import pairwise

from sortedcontainers import SortedKeyList, SortedList  # type: ignore[import-untyped]

from kvstore.meta.tenants import tenant_of

_ABSENT = object()


class KeyOrders:
    def __init__(self) -> None:
        self._by_tenant: dict[int, dict[str, None]] = {}  # insertion order = recency
        self.sorted: SortedList = SortedList()

    def added(self, key: str) -> None:
        """`key` became COMPLETE, as the most recently used."""
        if key[:1] == "\0":
            self._by_tenant.setdefault(tenant_of(key), {})[key] = None
        self.sorted.add(key)

    def removed(self, key: str) -> None:
        if key[:1] == "\0":
            tenant = tenant_of(key)
            keys = self._by_tenant.get(tenant)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._by_tenant[tenant]
        self.sorted.discard(key)

    def touched(self, key: str) -> None:
        """`key` is now the most recently used of its tenant's."""
        if key[:1] == "\0":
            keys = self._by_tenant[tenant_of(key)]
            del keys[key]
            keys[key] = None

    def of_tenant(self, tenant: int) -> Iterator[str]:
        """A namespaced tenant's keys, least recently used first. Do not mutate while iterating."""
        return iter(self._by_tenant.get(tenant, ()))

    def page(self, prefix: str, cursor: str, limit: int, hidden: str = "") -> tuple[list[str], bool]:
        """The first `limit` keys in byte order that start with `prefix`, not with `hidden`, and
        sort after `cursor`; and whether more follow."""
        found: list[str] = []
        start, inclusive = (prefix, True) if cursor < prefix else (cursor, False)
        while len(found) <= limit:
            skipped_to = ""
            for key in self.sorted.irange(minimum=start, inclusive=(inclusive, True)):
                if not key.startswith(prefix):
                    return found[:limit], len(found) > limit
                if hidden and key.startswith(hidden):
                    skipped_to = _after(hidden)  # the hidden keys are one run: jump past it
                    break
                found.append(key)
                if len(found) > limit:
                    break
            if not skipped_to:
                break
            start, inclusive = skipped_to, True
        return found[:limit], len(found) > limit

    def check(self, complete: Mapping[str, object]) -> None:
        assert len(self.sorted) == len(complete), "the byte order lost or kept a key"
        namespaced = sum(len(keys) for keys in self._by_tenant.values())
        assert namespaced == sum(1 for k in complete if k[:1] == "\0"), "a tenant's order lost or kept a key"


class SegmentOrders:
    """Per segment number, the COMPLETE keys with a replica in it, least recently used first.

    Recency is a stamp per key (`stamp_of`) that the index raises each time a key is committed or
    touched, so the index's own order is ascending stamps, and merging some segments' orders by
    stamp gives the index's order restricted to those segments. `stamp_of(key)` must give the
    stamp a key had when it was added: the index discards a key before it restamps or forgets it.
    """

    def __init__(self, stamp_of: Callable[[str], int]) -> None:
        self._stamp_of = stamp_of
        self._by_segment: dict[int, _Segment] = {}

    def add(self, key: str, numbers: Iterable[int], newest: bool = False) -> None:
        """`key` has a replica in each of the segments `numbers` now; `newest`: its stamp is the
        greatest of all (committed or touched just now), else it came with the one it had."""
        for number in numbers:
            seg = self._by_segment.get(number)
            if seg is None:
                seg = self._by_segment[number] = _Segment(self._stamp_of)
            seg.add(key, newest)

    def discard(self, key: str, numbers: Iterable[int]) -> None:
        """`key` has no replica in the segments `numbers` any more (or is about to be restamped)."""
        for number in numbers:
            seg = self._by_segment[number]
            seg.discard(key)
            if not seg:
                del self._by_segment[number]

    def taken_out(self, key: str, number: int) -> dict[str, None]:
        """Take `key` out of segment `number`'s order, to be restamped as the newest and put back
        into the dict this returns (its newest end): ObjectIndex.touch of a key with one replica,
        without discard()'s and add()'s sets and loops."""
        seg = self._by_segment[number]
        seg.discard(key)
        return seg.recent

    def least_recent(self, numbers: Iterable[int]) -> Iterator[str]:
        """The keys with a replica in any of the segments `numbers`, each once, least recently used
        first. Costs O(segments) to start and O(log segments) a key. Do not mutate while iterating."""
        orders = [seg.least_recent() for n in numbers if (seg := self._by_segment.get(n)) is not None]
        if len(orders) == 1:
            return orders[0]
        return _once(heapq.merge(*orders, key=self._stamp_of))

    def check(self, complete: Mapping[str, object], numbers_of: Callable[[str], Collection[int]]) -> None:
        held = 0
        for number, seg in self._by_segment.items():
            assert seg, f"segment {number}'s order is empty, not gone"
            assert not (seg.recent.keys() & set(seg.late)), f"a key is twice in segment {number}'s order"
            # a key in `late` is found by its stamp: only if it was not restamped behind its back
            assert all(key in seg.late for key in seg.late), f"segment {number}'s order lost track of a stamp"
            keys = list(seg.least_recent())
            assert all(key in complete and number in numbers_of(key) for key in keys), f"segment {number} is off"
            stamps = [self._stamp_of(key) for key in keys]
            assert all(a < b for a, b in pairwise(stamps)), f"segment {number}'s order is not by recency"
            held += len(keys)
        assert held == sum(len(numbers_of(k)) for k in complete), "a segment's order lost a key"


class _Segment:
    """One segment's keys, in two parts: `recent` in the order they came, each as the newest of them
    (by a commit or a touch, as most do: O(1)); `late` by stamp, those that came older than that (a
    replica moved or copied in: O(log n))."""

    __slots__ = ("_stamp_of", "late", "recent")

    def __init__(self, stamp_of: Callable[[str], int]) -> None:
        self._stamp_of = stamp_of
        self.recent: dict[str, None] = {}
        self.late = SortedKeyList(key=stamp_of)

    def __bool__(self) -> bool:
        return bool(self.recent or self.late)

    def add(self, key: str, newest: bool) -> None:
        recent = self.recent
        if newest or not recent or self._stamp_of(key) > self._stamp_of(next(reversed(recent))):
            recent[key] = None
        else:
            self.late.add(key)

    def discard(self, key: str) -> None:
        if self.recent.pop(key, _ABSENT) is _ABSENT:
            self.late.remove(key)

    def least_recent(self) -> Iterator[str]:
        if not self.late:
            return iter(self.recent)
        return heapq.merge(self.recent, self.late, key=self._stamp_of)


def _once(keys: Iterator[str]) -> Iterator[str]:
    """`keys` without repeats, where repeats come together: a key with replicas in two of the
    merged segments comes from both, one after the other (one stamp a key)."""
    previous = None
    for key in keys:
        if key != previous:
            yield key
        previous = key


def _after(prefix: str) -> str:
    """The least string greater than every string that starts with `prefix`."""
    while prefix and prefix[-1] == "\U0010ffff":
        prefix = prefix[:-1]
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"
