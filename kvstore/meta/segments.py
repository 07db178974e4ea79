"""Mounted segments, the daemons that own them, and their liveness.

Each segment gets a small number when mounted; the index stores a replica's location as one int,
`number << OFFSET_BITS | offset`, to keep per-block metadata small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvstore.errors import InvalidArgument
from kvstore.meta.allocator import OffsetAllocator
from kvstore.meta.holds import Holds
from kvstore.results import GetResult, PutStartResult
from kvstore.types import SegmentInfo, Tier

OFFSET_BITS = 44  # segments up to 16 TiB
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
ALIGNMENT = {Tier.DRAM: 64, Tier.GPU: 256, Tier.SSD: 4096}


def pack_location(number: int, offset: int) -> int:
    return number << OFFSET_BITS | offset


def unpack_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & _OFFSET_MASK


@dataclass
class Segment:
    info: SegmentInfo
    number: int  # persistent (kept in the journal), so a loaded index rebuilds its locations
    allocator: OffsetAllocator
    confirmed: bool = True  # False: loaded from the journal, or set aside; its daemon has not mounted it again yet
    set_aside: float = 0.0  # monotonic time its daemon was found silent (0: it was not): kept, not used

    @property
    def segment_id(self) -> str:
        return self.info.segment_id

    @property
    def daemon_id(self) -> str:
        return self.info.daemon_id

    def local_to(self, client_host: str) -> bool:
        """Whether a client on `client_host` reaches this segment over shm (its grants LOCAL)."""
        return bool(client_host) and client_host == self.info.host_id and self.info.endpoint("shm") is not None


@dataclass
class Daemon:
    daemon_id: str
    last_heartbeat: float  # on the monotonic clock
    segment_ids: set[str] = field(default_factory=set)
    suspect_until: float = 0.0  # a client reported a failed transfer: avoided until then


class SegmentTable:
    def __init__(self) -> None:
        self._by_id: dict[str, Segment] = {}
        self._by_number: dict[int, Segment] = {}
        self._daemons: dict[str, Daemon] = {}
        self._next_number = 1
        self.holds = Holds()  # space placed (or let go of) outside any stored object
        # Segments change rarely and are asked for on every put: the lists per tier are kept,
        # and rebuilt when a mount, confirmation or unmount moves `_version` on.
        self._version = 0
        self._views: dict[tuple[bool, Tier | None], tuple[int, tuple[Segment, ...]]] = {}
        self._largest: dict[Tier, tuple[int, int]] = {}

    def _view(self, usable_only: bool, tier: Tier | None) -> tuple[Segment, ...]:
        hit = self._views.get((usable_only, tier))
        if hit is not None and hit[0] == self._version:
            return hit[1]
        segs = tuple(
            s
            for s in self._by_id.values()
            if (tier is None or s.info.tier == tier) and (s.confirmed or not usable_only)
        )
        self._views[usable_only, tier] = (self._version, segs)
        return segs

    def mount(self, info: SegmentInfo, now: float, number: int = 0, confirmed: bool = True) -> Segment:
        """Add a segment with all of its space free (as number `number`, when loaded from the
        journal). Mounting the same segment again is a no-op; the daemon mounting a segment that
        was loaded unconfirmed confirms it (its endpoints may have changed)."""
        existing = self._by_id.get(info.segment_id)
        if existing is not None and not existing.confirmed and confirmed:
            if (existing.info.daemon_id, existing.info.tier, existing.info.capacity) != (
                info.daemon_id,
                info.tier,
                info.capacity,
            ):
                raise InvalidArgument(
                    f"segment {info.segment_id} comes back from daemon {info.daemon_id} as {info.tier.value} of "
                    f"{info.capacity} bytes, not as it was recorded: unmount it first"
                )
            existing.info, existing.confirmed, existing.set_aside = info, True, 0.0
            self._version += 1
            self.heartbeat(info.daemon_id, now)
            return existing
        if existing is not None:
            if existing.info != info:
                raise InvalidArgument(
                    f"segment {info.segment_id} is already mounted with other settings; "
                    "segment ids must be unique (unmount it first)"
                )
            self.heartbeat(info.daemon_id, now)
            return existing
        if info.capacity <= 0 or info.capacity > _OFFSET_MASK:
            raise InvalidArgument(f"segment capacity {info.capacity} must be between 1 byte and 16 TiB")
        if not info.endpoints:
            raise InvalidArgument(f"segment {info.segment_id} offers no transport endpoint")
        number = number or self._next_number
        if number in self._by_number:
            raise InvalidArgument(f"segment number {number} is taken: the journal holds two segments under it")
        seg = Segment(info, number, OffsetAllocator(info.capacity, ALIGNMENT[info.tier]), confirmed)
        self._next_number = max(self._next_number, number + 1)
        self._by_id[info.segment_id] = seg
        self._by_number[seg.number] = seg
        self._version += 1
        daemon = self._daemons.setdefault(info.daemon_id, Daemon(info.daemon_id, now))
        daemon.segment_ids.add(info.segment_id)
        daemon.last_heartbeat = now
        daemon.suspect_until = 0.0  # it mounts, so it is there
        return seg

    def unmount(self, segment_id: str) -> Segment | None:
        """Forget a segment; the caller drops the replicas that lived in it."""
        seg = self._by_id.pop(segment_id, None)
        if seg is None:
            return None
        self._version += 1
        del self._by_number[seg.number]
        self.holds.forget(lambda loc: loc >> OFFSET_BITS == seg.number)
        daemon = self._daemons.get(seg.daemon_id)
        if daemon is not None:
            daemon.segment_ids.discard(segment_id)
            if not daemon.segment_ids:
                del self._daemons[seg.daemon_id]
        return seg

    def set_aside(self, segment_id: str, now: float) -> None:
        """Its daemon went silent: keep the segment and its replicas, read and place nothing there,
        until the daemon mounts it again (confirming it) or it is dropped."""
        seg = self._by_id[segment_id]
        seg.confirmed, seg.set_aside = False, now
        self._version += 1

    def heartbeat(self, daemon_id: str, now: float) -> bool:
        """Record that a daemon is alive; False if it has no mounted segments."""
        daemon = self._daemons.get(daemon_id)
        if daemon is None:
            return False
        daemon.last_heartbeat = now
        return True

    def suspect(self, segment_ids: Sequence[str], until: float) -> list[str]:
        """Clients saw transfers to these segments fail: avoid their daemons until `until`.
        Returns the daemons newly suspected."""
        newly = []
        for segment_id in segment_ids:
            seg = self._by_id.get(segment_id)
            daemon = self._daemons.get(seg.daemon_id) if seg is not None else None
            if daemon is not None:
                if daemon.suspect_until < until:
                    newly.append(daemon.daemon_id)
                daemon.suspect_until = max(daemon.suspect_until, until)
        return newly

    def is_suspect(self, daemon_id: str, now: float) -> bool:
        daemon = self._daemons.get(daemon_id)
        return daemon is not None and daemon.suspect_until > now

    def silent_daemons(self, now: float, ttl: float) -> list[Daemon]:
        return [d for d in self._daemons.values() if now - d.last_heartbeat > ttl]

    def named_by(self, results: Sequence[PutStartResult | GetResult]) -> dict[str, SegmentInfo]:
        """Every segment the results' grants name, by id."""
        ids = dict.fromkeys(g.segment_id for r in results for g in r.grants)
        return {sid: seg.info for sid in ids if (seg := self._by_id.get(sid)) is not None}

    def get(self, segment_id: str) -> Segment | None:
        return self._by_id.get(segment_id)

    def by_number(self, number: int) -> Segment:
        return self._by_number[number]

    def has_number(self, number: int) -> bool:
        return number in self._by_number

    def daemons(self) -> list[Daemon]:
        return list(self._daemons.values())

    def segments(self, tier: Tier | None = None) -> tuple[Segment, ...]:
        """Every mounted segment (of `tier`), confirmed or not."""
        return self._view(False, tier)

    def usable(self, tier: Tier | None = None) -> tuple[Segment, ...]:
        """The segments new blocks may go to: mounted and confirmed by their daemon."""
        return self._view(True, tier)

    def unconfirmed(self) -> list[Segment]:
        """Loaded from the journal or set aside, and not mounted again since."""
        return [s for s in self._by_id.values() if not s.confirmed]

    def largest_capacity(self, tier: Tier) -> int:
        """The capacity of `tier`'s largest segment (asked on every put: kept until the table changes)."""
        hit = self._largest.get(tier)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        largest = max((s.allocator.capacity for s in self._view(False, tier)), default=0)
        self._largest[tier] = (self._version, largest)
        return largest

    def daemons_with(self, tier: Tier) -> frozenset[str]:
        """The daemons that have a segment of `tier`."""
        return frozenset(s.daemon_id for s in self._view(False, tier))

    def place_on(self, daemon_id: str, tier: Tier, size: int) -> tuple[Segment, int] | None:
        """Allocate `size` bytes in one of `daemon_id`'s segments of `tier`, emptiest first."""
        segs = [s for s in self.usable(tier) if s.daemon_id == daemon_id]
        for seg in sorted(segs, key=lambda s: -s.allocator.free_bytes):
            offset = seg.allocator.allocate(size)
            if offset is not None:
                self.holds.hold(pack_location(seg.number, offset), size)
                return seg, offset
        return None

    def place(
        self, size: int, replica_num: int, tier: Tier = Tier.DRAM, now: float = 0.0, suspects: bool = True
    ) -> list[tuple[Segment, int]]:
        """Allocate up to `replica_num` copies of `size` bytes on distinct daemons, emptiest first,
        daemons under suspicion last (or, without `suspects`, not at all).

        Returns fewer copies than asked when fewer daemons have room (the block is then stored
        degraded), and [] when none has.
        """
        by_daemon: dict[str, list[Segment]] = {}
        free: dict[str, int] = {}  # per daemon, over its usable segments of `tier`
        for seg in self.usable(tier):  # one pass, as every put asks (no per-daemon sums in the sort)
            daemon = seg.info.daemon_id
            if suspects or not self.is_suspect(daemon, now):
                by_daemon.setdefault(daemon, []).append(seg)
                free[daemon] = free.get(daemon, 0) + seg.allocator.capacity - seg.allocator.used
        if len(by_daemon) == 1:
            ranked = list(by_daemon.values())
        else:
            ranked = [by_daemon[d] for d in sorted(by_daemon, key=lambda d: (self.is_suspect(d, now), -free[d]))]
        placed: list[tuple[Segment, int]] = []
        for segs in ranked:
            for seg in sorted(segs, key=lambda s: s.allocator.used - s.allocator.capacity) if len(segs) > 1 else segs:
                offset = seg.allocator.allocate(size)
                if offset is not None:
                    self.holds.hold(pack_location(seg.number, offset), size)
                    placed.append((seg, offset))
                    break
            if len(placed) == replica_num:
                break
        return placed
