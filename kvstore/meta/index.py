r"""The object index: every key's lifecycle and where its replicas live.

Lifecycle (ObjectState):  ABSENT --begin_put--> PENDING --commit--> COMPLETE --remove--> ABSENT
                                                   \--abandon (revoke / put lease expiry)--> ABSENT

PENDING and COMPLETE objects live in separate tables so the hot COMPLETE table holds only what
reads need. The COMPLETE table's insertion order is its recency order (oldest first): `touch`
moves a key to the end, so LRU eviction walks from the front without a separate list. Each entry
also carries its recency as a stamp, rising with every commit and touch, by which the orders per
segment (orders.SegmentOrders) are kept: eviction that frees some segments walks only their keys.

Memory: at millions of blocks each COMPLETE entry must stay under 300 bytes including its key, so an
entry is stored as one int (entry.py), which the garbage collector never walks, and a replica
location is one packed int (see segments.py). The orders kept beside (orders.py) cost about 50
bytes a key: a place in the byte order and in its segment's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from itertools import pairwise
from typing import Protocol

from kvstore.errors import AlreadyExists, KeyBusy, KeyNotFound
from kvstore.meta import entry as packing
from kvstore.meta.entry import Entry as Entry  # the index's record type, re-exported
from kvstore.meta.orders import KeyOrders, SegmentOrders
from kvstore.meta.segments import OFFSET_BITS
from kvstore.meta.tenants import DEFAULT_ID, tenant_of

_MAX_SHARED_SIZES = 4096

# Told (key, locations, entry) when a COMPLETE key stops having replicas at `locations`
# (removed, evicted, moved away, or its segment dropped); it must only record.
LostReplicas = Callable[[str, tuple[int, ...], "Entry"], None]


class Watcher(Protocol):
    """An eviction policy that keeps its own order (eviction.py): told of every COMPLETE key's
    arrival, use and departure, under the store's lock, in O(1)."""

    def added(self, key: str) -> None: ...

    def used(self, key: str) -> None: ...

    def removed(self, key: str) -> None: ...


class ObjectState(Enum):
    ABSENT = "absent"
    PENDING = "pending"
    COMPLETE = "complete"


def _pack(locations: tuple[int, ...]) -> int | tuple[int, ...]:
    return locations[0] if len(locations) == 1 else locations


@dataclass(slots=True)
class PendingPut:
    locations: tuple[int, ...]
    size: int
    deadline: float  # the put lease: after this the put may be revoked
    grant_until_ms: int = 0  # its write grants' expiry
    checked: int = 0  # bit i: replica i's grant is daemon-checked (not LOCAL)
    wanted: int = 1  # replicas the put asked for


class ObjectIndex:
    def __init__(self) -> None:
        self._complete: dict[str, int] = {}  # key -> its Entry as one int (entry.py)
        self._pending: dict[str, PendingPut] = {}
        self._sizes: dict[int, int] = {}
        # Per tenant other than the default (whose keys carry no namespace): COMPLETE keys, and
        # bytes PENDING puts hold (size x replicas), for quotas and a tenant's view of the stats.
        self.tenant_keys: Counter[int] = Counter()
        self.tenant_pending: Counter[int] = Counter()
        self.orders = KeyOrders()  # per tenant recency, byte order
        self.by_segment = SegmentOrders(lambda key: packing.stamp_of(self._complete[key]))
        self._stamp = 0  # the last one given
        self.on_lost: LostReplicas | None = None  # forgets.py: SSD journals hear of what is gone
        self.watcher: Watcher | None = None  # the eviction policy, if it keeps its own order

    def __len__(self) -> int:
        return len(self._complete)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def state(self, key: str) -> ObjectState:
        if key in self._complete:
            return ObjectState.COMPLETE
        if key in self._pending:
            return ObjectState.PENDING
        return ObjectState.ABSENT

    def get(self, key: str) -> Entry | None:
        packed = self._complete.get(key)
        return None if packed is None else packing.decode(packed)

    def get_pending(self, key: str) -> PendingPut | None:
        return self._pending.get(key)

    def is_complete(self, key: str) -> bool:
        return key in self._complete

    def begin_put(self, key: str, size: int, locations: tuple[int, ...], deadline: float, **grants: int) -> PendingPut:
        """ABSENT -> PENDING; `grants`: the PendingPut's grant fields."""
        if key in self._complete:
            raise AlreadyExists(key)
        if key in self._pending:
            raise KeyBusy(key)
        if len(self._sizes) < _MAX_SHARED_SIZES:
            size = self._sizes.setdefault(size, size)  # KV blocks share a few sizes: one int each
        put = self._pending[key] = PendingPut(locations, size, deadline, **grants)
        self.tenant_pending[tenant_of(key)] += size * len(locations)
        return put

    def commit(self, key: str, checksum: int) -> Entry:
        """PENDING -> COMPLETE, as the most recently used object."""
        put = self._pending.get(key)
        if put is None:
            raise KeyNotFound(key)
        packed = packing.encode(_pack(put.locations), put.size, checksum, self._stamp + 1)  # before any change
        del self._pending[key]
        self.tenant_pending[tenant_of(key)] -= put.size * len(put.locations)
        self._added(key, packed, put.locations)
        return packing.decode(packed)

    def insert_complete(self, key: str, locations: tuple[int, ...], size: int, checksum: int) -> None:
        """ABSENT -> COMPLETE directly: a block a restarted daemon found intact on disk, or a
        value written into a region."""
        if key in self._complete or key in self._pending:
            raise AlreadyExists(key)
        self._added(key, packing.encode(_pack(locations), size, checksum, self._stamp + 1), locations)

    def insert_one(self, key: str, location: int, size: int, checksum: int) -> None:
        """insert_complete() of a one-replica object whose key the caller found ABSENT (under the
        same lock): a region's value."""
        self._added(key, packing.encode(location, size, checksum, self._stamp + 1), (location,))

    def _added(self, key: str, packed: int, locations: tuple[int, ...]) -> None:
        """`packed`: the object's record, stamped with the next stamp (encoded by the caller, so a
        field too wide is refused before anything changes), its replicas at `locations`."""
        self._stamp += 1
        self._complete[key] = packed
        self.orders.added(key)
        self.by_segment.add(key, packing.segment_numbers(locations), newest=True)
        if key[:1] == "\0":
            self.tenant_keys[tenant_of(key)] += 1
        if self.watcher is not None:
            self.watcher.added(key)

    def _next_stamp(self) -> int:
        self._stamp += 1
        return self._stamp

    def abandon(self, key: str) -> PendingPut:
        """PENDING -> ABSENT; the caller frees the space."""
        put = self._pending.pop(key, None)
        if put is None:
            raise KeyNotFound(key)
        self.tenant_pending[tenant_of(key)] -= put.size * len(put.locations)
        return put

    def remove(self, key: str) -> Entry:
        """COMPLETE -> ABSENT; the caller frees the space."""
        entry = self.get(key)
        if entry is None:
            raise KeyNotFound(key)
        self.by_segment.discard(key, entry.segments())  # while its stamp is still to be found
        del self._complete[key]
        self.orders.removed(key)
        if key[:1] == "\0":
            self.tenant_keys[tenant_of(key)] -= 1
        if self.on_lost is not None:
            self.on_lost(key, entry.replicas(), entry)
        if self.watcher is not None:
            self.watcher.removed(key)
        return entry

    def touch(self, key: str) -> None:
        """Mark a COMPLETE key most recently used."""
        complete = self._complete
        packed = complete.get(key)
        if packed is None:
            return
        self.orders.touched(key)
        # Out of its segments' orders while the index still holds its old stamp (they find a key by
        # its stamp), then back in as the newest; del + insert moves it to the end of the recency.
        loc = packing.single_location(packed)
        if loc is not None:  # one replica, as most blocks have: no set of segment numbers
            recent = self.by_segment.taken_out(key, loc >> OFFSET_BITS)
            del complete[key]
            complete[key] = packing.restamped(packed, self._next_stamp())
            recent[key] = None
        else:
            numbers = packing.decode(packed).segments()
            self.by_segment.discard(key, numbers)
            del complete[key]
            complete[key] = packing.restamped(packed, self._next_stamp())
            self.by_segment.add(key, numbers, newest=True)
        if self.watcher is not None:
            self.watcher.used(key)

    def set_replicas(self, key: str, locations: tuple[int, ...]) -> None:
        """Replace where a key lives (a replica was lost, or the block moved); keeps recency."""
        if key in self._complete:
            entry = packing.decode(self._complete[key])
            packed = packing.encode(_pack(locations), entry.size, entry.checksum, entry.stamp)  # before any change
            if self.on_lost is not None and (lost := tuple(x for x in entry.replicas() if x not in locations)):
                self.on_lost(key, lost, entry)
            was = entry.segments()
            self._complete[key] = packed
            now = packing.decode(packed).segments()
            self.by_segment.discard(key, was - now)
            self.by_segment.add(key, now - was)
        elif key in self._pending:
            put = self._pending[key]
            self.tenant_pending[tenant_of(key)] += put.size * (len(locations) - len(put.locations))
            put.locations = locations
        else:
            raise KeyNotFound(key)

    def least_recent(self) -> Iterator[tuple[str, Entry]]:
        """COMPLETE objects, least recently used first. Do not mutate while iterating."""
        return ((k, packing.decode(t)) for k, t in self._complete.items())

    def least_recent_of(self, tenant: int) -> Iterator[tuple[str, Entry]]:
        """A tenant's COMPLETE objects, least recently used first (the default tenant's, which carry
        no namespace, by a walk of every key). Do not mutate while iterating."""
        if tenant == DEFAULT_ID:
            return ((k, packing.decode(t)) for k, t in self._complete.items() if k[:1] != "\0")
        complete = self._complete
        return ((k, packing.decode(complete[k])) for k in self.orders.of_tenant(tenant))

    def least_recent_in(self, numbers: Iterable[int]) -> Iterator[tuple[str, Entry]]:
        """The COMPLETE objects with a replica in any of the segments `numbers`, least recently used
        first, in O(segments + objects walked). Do not mutate while iterating."""
        complete = self._complete
        return ((k, packing.decode(complete[k])) for k in self.by_segment.least_recent(numbers))

    def pending_items(self) -> Iterator[tuple[str, PendingPut]]:
        return iter(self._pending.items())

    def expired_puts(self, now: float) -> list[str]:
        return [k for k, p in self._pending.items() if p.deadline < now]

    def all_locations(self) -> Iterator[tuple[str, tuple[int, ...], int]]:
        """(key, locations, size) for every object that holds space, PENDING or COMPLETE."""
        for key, packed in self._complete.items():
            entry = packing.decode(packed)
            yield key, entry.replicas(), entry.size
        for key, put in self._pending.items():
            yield key, put.locations, put.size

    def check_invariants(self) -> None:
        assert not (self._complete.keys() & self._pending.keys()), "a key is both PENDING and COMPLETE"
        self.orders.check(self._complete)
        stamps = [packing.stamp_of(p) for p in self._complete.values()]
        assert all(a < b for a, b in pairwise(stamps)), "the recency stamps do not rise with recency"
        self.by_segment.check(self._complete, lambda key: packing.decode(self._complete[key]).segments())
        assert all(type(p) is int for p in self._complete.values()), "an entry stored as other than an int"
        for key, locations, size in self.all_locations():
            assert size > 0 and locations, f"{key}: size {size}, locations {locations}"
            assert len(set(locations)) == len(locations), f"{key}: duplicate replica"


class Scope(Protocol):
    """The COMPLETE objects an eviction may take: the whole index, one tenant's (TenantRecency),
    or those in some segments (SegmentRecency)."""

    def least_recent(self) -> Iterator[tuple[str, Entry]]:
        """The objects in the scope, least recently used first."""

    def entry(self, key: str) -> Entry | None:
        """`key`'s entry if it is a COMPLETE object in the scope, else None. O(1)."""


class TenantRecency:
    """One tenant's objects as an eviction policy walks them (least recently used first)."""

    def __init__(self, index: ObjectIndex, tenant: int) -> None:
        self._index = index
        self._tenant = tenant

    def least_recent(self) -> Iterator[tuple[str, Entry]]:
        return self._index.least_recent_of(self._tenant)

    def entry(self, key: str) -> Entry | None:
        return self._index.get(key) if tenant_of(key) == self._tenant else None


class SegmentRecency:
    """The objects with a replica in some segments as an eviction policy walks them (least recently
    used first): what frees space in those segments, without stepping over the others' keys."""

    def __init__(self, index: ObjectIndex, numbers: Iterable[int]) -> None:
        self._index = index
        self._numbers = numbers if isinstance(numbers, (set, frozenset)) else frozenset(numbers)

    def least_recent(self) -> Iterator[tuple[str, Entry]]:
        return self._index.least_recent_in(self._numbers)

    def entry(self, key: str) -> Entry | None:
        entry = self._index.get(key)
        if entry is None:
            return None
        loc = entry.locations
        if isinstance(loc, int):
            return entry if loc >> OFFSET_BITS in self._numbers else None
        return entry if any(x >> OFFSET_BITS in self._numbers for x in loc) else None
