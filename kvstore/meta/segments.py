"""Mounted segments, the daemons that own them, and their liveness.

Each segment gets a small number when mounted; the index stores a replica's location as one int,
`number << OFFSET_BITS | offset`, to keep per-block metadata small.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.errors import InvalidArgument
from kvstore.meta.allocator import OffsetAllocator
from kvstore.types import SegmentInfo, Tier

OFFSET_BITS = 44                    # segments up to 16 TiB
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
ALIGNMENT = {Tier.DRAM: 64, Tier.GPU: 256, Tier.SSD: 4096}


def pack_location(number: int, offset: int) -> int:
    return number << OFFSET_BITS | offset


def unpack_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & _OFFSET_MASK


@dataclass
class Segment:
    info: SegmentInfo
    number: int
    allocator: OffsetAllocator

    @property
    def segment_id(self) -> str:
        return self.info.segment_id

    @property
    def daemon_id(self) -> str:
        return self.info.daemon_id


@dataclass
class Daemon:
    daemon_id: str
    last_heartbeat: float
    segment_ids: set[str] = field(default_factory=set)


class SegmentTable:
    def __init__(self) -> None:
        self._by_id: dict[str, Segment] = {}
        self._by_number: dict[int, Segment] = {}
        self._daemons: dict[str, Daemon] = {}
        self._next_number = 1

    def mount(self, info: SegmentInfo, now: float) -> Segment:
        """Add a segment with all of its space free. Mounting the same segment again is a no-op."""
        existing = self._by_id.get(info.segment_id)
        if existing is not None:
            if existing.info != info:
                raise InvalidArgument(f"segment {info.segment_id} is already mounted with other settings; "
                                      "segment ids must be unique (unmount it first)")
            self.heartbeat(info.daemon_id, now)
            return existing
        if info.capacity <= 0 or info.capacity > _OFFSET_MASK:
            raise InvalidArgument(f"segment capacity {info.capacity} must be between 1 byte and 16 TiB")
        if not info.endpoints:
            raise InvalidArgument(f"segment {info.segment_id} offers no transport endpoint")
        seg = Segment(info, self._next_number, OffsetAllocator(info.capacity, ALIGNMENT[info.tier]))
        self._next_number += 1
        self._by_id[info.segment_id] = seg
        self._by_number[seg.number] = seg
        daemon = self._daemons.setdefault(info.daemon_id, Daemon(info.daemon_id, now))
        daemon.segment_ids.add(info.segment_id)
        daemon.last_heartbeat = now
        return seg

    def unmount(self, segment_id: str) -> Segment | None:
        """Forget a segment; the caller drops the replicas that lived in it."""
        seg = self._by_id.pop(segment_id, None)
        if seg is None:
            return None
        del self._by_number[seg.number]
        daemon = self._daemons.get(seg.daemon_id)
        if daemon is not None:
            daemon.segment_ids.discard(segment_id)
            if not daemon.segment_ids:
                del self._daemons[seg.daemon_id]
        return seg

    def heartbeat(self, daemon_id: str, now: float) -> bool:
        """Record that a daemon is alive; False if it has no mounted segments."""
        daemon = self._daemons.get(daemon_id)
        if daemon is None:
            return False
        daemon.last_heartbeat = now
        return True

    def silent_daemons(self, now: float, ttl: float) -> list[Daemon]:
        return [d for d in self._daemons.values() if now - d.last_heartbeat > ttl]

    def get(self, segment_id: str) -> Segment | None:
        return self._by_id.get(segment_id)

    def by_number(self, number: int) -> Segment:
        return self._by_number[number]

    def daemons(self) -> list[Daemon]:
        return list(self._daemons.values())

    def segments(self, tier: Tier | None = None) -> list[Segment]:
        return [s for s in self._by_id.values() if tier is None or s.info.tier == tier]

    def largest_capacity(self, tier: Tier) -> int:
        return max((s.allocator.capacity for s in self.segments(tier)), default=0)

    def place_on(self, daemon_id: str, tier: Tier, size: int) -> tuple[Segment, int] | None:
        """Allocate `size` bytes in one of `daemon_id`'s segments of `tier`, emptiest first."""
        segs = [s for s in self.segments(tier) if s.daemon_id == daemon_id]
        for seg in sorted(segs, key=lambda s: -s.allocator.free_bytes):
            offset = seg.allocator.allocate(size)
            if offset is not None:
                return seg, offset
        return None

    def place(self, size: int, replica_num: int, tier: Tier = Tier.DRAM) -> list[tuple[Segment, int]]:
        """Allocate up to `replica_num` copies of `size` bytes on distinct daemons, emptiest first.

        Returns fewer copies than asked when fewer daemons have room (the block is then stored
        degraded), and [] when none has.
        """
        by_daemon: dict[str, list[Segment]] = {}
        for seg in self.segments(tier):
            by_daemon.setdefault(seg.daemon_id, []).append(seg)
        ranked = sorted(by_daemon.values(), key=lambda segs: -sum(s.allocator.free_bytes for s in segs))
        placed: list[tuple[Segment, int]] = []
        for segs in ranked:
            for seg in sorted(segs, key=lambda s: -s.allocator.free_bytes):
                offset = seg.allocator.allocate(size)
                if offset is not None:
                    placed.append((seg, offset))
                    break
            if len(placed) == replica_num:
                break
        return placed
