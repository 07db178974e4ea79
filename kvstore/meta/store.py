"""MetaStore: the metadata service's logic as a plain, thread-safe class (no gRPC here).

It ties together the index (what exists), the segment table (where space is), leases (what must
not move), and the eviction policy (what to drop). Every public method takes the one lock, reads
the injected clock once, and leaves `check_invariants()` true.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Sequence

from kvstore.clock import Clock, SystemClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.grant import GrantSigner
from kvstore.meta.eviction import EvictionPolicy, LRUEviction
from kvstore.meta.index import ObjectIndex, ObjectState
from kvstore.meta.lease import LeaseTable
from kvstore.meta.results import (OK, DaemonStats, GetResult, KeyResult, PutStartResult, StoreStats,
                                  TierStats)
from kvstore.meta.segments import Segment, SegmentTable, pack_location, unpack_location
from kvstore.types import GrantMode, SegmentInfo, Tier, validate_key

log = logging.getLogger(__name__)

# A put is revoked this long after its write grants expire, so a transfer that started just
# before expiry cannot land in space already handed to another key.
REVOKE_GRACE_S = 2.0
EVICTION_STEP = 0.05   # when out of room, evict at least this share of capacity per round


class MetaStore:
    def __init__(self, config: MetaConfig, signer: GrantSigner, clock: Clock | None = None,
                 policy: EvictionPolicy | None = None) -> None:
        self.config = config
        self._signer = signer
        self._clock = clock or SystemClock()
        self._policy = policy or LRUEviction()
        self._index = ObjectIndex()
        self._segments = SegmentTable()
        self._leases = LeaseTable()
        self._lock = threading.RLock()
        self._counters: Counter[str] = Counter()
        self._tier_counters: Counter[tuple[Tier, str]] = Counter()

    # -- segments and daemons -------------------------------------------------------------------

    def mount_segment(self, info: SegmentInfo) -> None:
        with self._lock:
            self._segments.mount(info, self._clock.now())
            log.info("mounted segment %s of daemon %s (%s, %d bytes)", info.segment_id, info.daemon_id,
                     info.tier.value, info.capacity)

    def unmount_segment(self, segment_id: str) -> int:
        """Forget a segment and every replica in it; returns how many replicas were dropped."""
        with self._lock:
            seg = self._segments.get(segment_id)
            if seg is None:
                return 0
            dropped = self._drop_segment_replicas(seg)
            self._segments.unmount(segment_id)
            return dropped

    def heartbeat(self, daemon_id: str, segment_ids: Sequence[str]) -> list[str]:
        """Record liveness; returns the ids among `segment_ids` that are not mounted."""
        with self._lock:
            self._segments.heartbeat(daemon_id, self._clock.now())
            return [s for s in segment_ids if self._segments.get(s) is None]

    def segments(self, segment_ids: Sequence[str]) -> list[SegmentInfo]:
        with self._lock:
            return [s.info for sid in dict.fromkeys(segment_ids) if (s := self._segments.get(sid))]

    # -- puts -----------------------------------------------------------------------------------

    def put_start(self, keys: Sequence[str], sizes: Sequence[int], replica_num: int = 1) -> list[PutStartResult]:
        """Reserve space for each key and return write grants; ALREADY_EXISTS for complete keys."""
        _validate_keys(keys)
        if len(sizes) != len(keys):
            raise InvalidArgument(f"{len(keys)} keys but {len(sizes)} sizes")
        if any(s <= 0 for s in sizes):
            raise InvalidArgument("every value must be at least 1 byte")
        if replica_num < 1:
            raise InvalidArgument("replica_num must be at least 1")
        with self._lock:
            now = self._clock.now()
            results = [self._put_start_one(k, s, replica_num, now) for k, s in zip(keys, sizes)]
            self._evict_to_watermark(now)
            return results

    def _put_start_one(self, key: str, size: int, replica_num: int, now: float) -> PutStartResult:
        state = self._index.state(key)
        if state is ObjectState.COMPLETE:
            return PutStartResult(ErrorCode.ALREADY_EXISTS, f"{key!r} is already stored")
        if state is ObjectState.PENDING:
            put = self._index.get_pending(key)
            if put.deadline + REVOKE_GRACE_S >= now:
                return PutStartResult(ErrorCode.KEY_BUSY, f"another put of {key!r} is in progress; "
                                      "read it once that put ends, or retry the put later")
            self._revoke(key)   # a stale put (its writer vanished) must not block the key forever
        largest = self._segments.largest_capacity(Tier.DRAM)
        if size > largest:
            return PutStartResult(ErrorCode.INVALID_ARGUMENT,
                                  f"value of {size} bytes is larger than any segment ({largest} bytes); "
                                  "split it into smaller blocks or mount larger segments")
        placed = self._place(size, replica_num, now)
        if not placed:
            return PutStartResult(ErrorCode.NO_SPACE, f"no room for {size} bytes even after eviction: "
                                  "add daemons or memory, or wait for leases and pins to end")
        deadline = now + self.config.put_lease_ttl_s
        locations = tuple(pack_location(seg.number, off) for seg, off in placed)
        self._index.begin_put(key, size, locations, deadline)
        grants = tuple(self._signer.sign(seg.segment_id, off, size, GrantMode.WRITE, int(deadline * 1000))
                       for seg, off in placed)
        return PutStartResult(grants=grants)

    def put_end(self, keys: Sequence[str], checksums: Sequence[int]) -> list[KeyResult]:
        """PENDING -> COMPLETE for each key; the bytes must have been written."""
        if len(checksums) != len(keys):
            raise InvalidArgument(f"{len(keys)} keys but {len(checksums)} checksums")
        with self._lock:
            results = []
            for key, crc in zip(keys, checksums):
                if self._index.get_pending(key) is None:
                    code = ErrorCode.OK if self._index.is_complete(key) else ErrorCode.KEY_NOT_FOUND
                    results.append(KeyResult(code, "" if code is ErrorCode.OK else
                                             f"no put of {key!r} in progress (revoked after its put lease, "
                                             "or its daemon died): put it again"))
                    continue
                entry = self._index.commit(key, crc)
                for loc in entry.replicas():
                    self._tier_counters[self._segment_of(loc).info.tier, "blocks"] += 1
                results.append(OK)
            return results

    def put_revoke(self, keys: Sequence[str]) -> list[KeyResult]:
        with self._lock:
            results = []
            for key in keys:
                if self._index.get_pending(key) is None:
                    results.append(KeyResult(ErrorCode.KEY_NOT_FOUND, f"no put of {key!r} in progress"))
                else:
                    self._revoke(key)
                    results.append(OK)
            return results

    # -- reads ----------------------------------------------------------------------------------

    def get(self, keys: Sequence[str]) -> list[GetResult]:
        """Read grants for each key's replicas, and a read lease that keeps them in place."""
        _validate_keys(keys)
        with self._lock:
            now = self._clock.now()
            until = now + self.config.lease_ttl_s
            results = []
            for key in keys:
                entry = self._index.get(key)
                if entry is None:
                    results.append(self._miss(key))
                    continue
                self._index.touch(key)
                self._leases.hold(key, until)
                grants = []
                for loc in entry.replicas():
                    seg = self._segment_of(loc)
                    self._tier_counters[seg.info.tier, "hits"] += 1
                    grants.append(self._signer.sign(seg.segment_id, unpack_location(loc)[1], entry.size,
                                                    GrantMode.READ, int(until * 1000)))
                results.append(GetResult(size=entry.size, checksum=entry.checksum, grants=tuple(grants)))
            return results

    def _miss(self, key: str) -> GetResult:
        if self._index.get_pending(key) is not None:
            return GetResult(ErrorCode.KEY_BUSY, f"{key!r} is still being written; retry once its put ends")
        return GetResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not stored (never put, removed, evicted, "
                         "or lost with its daemon); recompute it")

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is COMPLETE. Takes no lease: polling must not block eviction."""
        _validate_keys(keys)
        with self._lock:
            return [self._index.is_complete(k) for k in keys]

    def match_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys are COMPLETE. Takes no lease."""
        _validate_keys(keys)
        with self._lock:
            is_complete = self._index.is_complete
            for i, key in enumerate(keys):
                if not is_complete(key):
                    return i
            return len(keys)

    # -- removal and eviction -------------------------------------------------------------------

    def remove(self, keys: Sequence[str], force: bool = False) -> list[KeyResult]:
        _validate_keys(keys)
        with self._lock:
            now = self._clock.now()
            results = []
            for key in keys:
                state = self._index.state(key)
                if state is ObjectState.ABSENT:
                    results.append(KeyResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not stored"))
                elif state is ObjectState.PENDING:
                    results.append(KeyResult(ErrorCode.KEY_BUSY, f"{key!r} is being written; revoke the put "
                                             "or remove it after the put ends"))
                elif self._leases.held(key, now) and not force:
                    left = self._leases.until(key) - now
                    results.append(KeyResult(ErrorCode.KEY_BUSY, f"{key!r} is being read (lease ends in "
                                             f"{left:.1f} s); retry then, or remove with force"))
                else:
                    self._drop(key)
                    results.append(OK)
            return results

    def tick(self) -> None:
        """Periodic upkeep: revoke expired puts, end leases, drop silent daemons, evict."""
        with self._lock:
            now = self._clock.now()
            for key in self._index.expired_puts(now - REVOKE_GRACE_S):
                log.warning("revoking put of %r: not ended within its %.1f s put lease", key,
                            self.config.put_lease_ttl_s)
                self._revoke(key)
            self._leases.expire(now)
            for daemon in self._segments.silent_daemons(now, self.config.heartbeat_ttl_s):
                log.warning("daemon %s silent for %.1f s: dropping its %d segments", daemon.daemon_id,
                            now - daemon.last_heartbeat, len(daemon.segment_ids))
                for segment_id in list(daemon.segment_ids):
                    self.unmount_segment(segment_id)
            self._evict_to_watermark(now)

    def _protected(self, now: float):
        held = self._leases.held
        return lambda key: held(key, now)

    def _place(self, size: int, replica_num: int, now: float) -> list[tuple[Segment, int]]:
        placed = self._segments.place(size, replica_num)
        capacity = sum(s.allocator.capacity for s in self._segments.segments(Tier.DRAM))
        while not placed:
            step = max(size, int(capacity * EVICTION_STEP))
            victims = self._policy.victims(self._index, self._protected(now), step)
            if not victims:
                return []
            self._evict(victims)
            placed = self._segments.place(size, replica_num)
        return placed

    def _evict_to_watermark(self, now: float) -> None:
        segs = self._segments.segments(Tier.DRAM)
        capacity = sum(s.allocator.capacity for s in segs)
        used = sum(s.allocator.used for s in segs)
        if not capacity or used <= capacity * self.config.high_watermark:
            return
        need = used - int(capacity * self.config.low_watermark)
        self._evict(self._policy.victims(self._index, self._protected(now), need))

    def _evict(self, keys: list[str]) -> None:
        for key in keys:
            for loc in self._drop(key):
                self._tier_counters[self._segment_of(loc).info.tier, "evictions"] += 1
        self._counters["evictions"] += len(keys)

    # -- mechanism ------------------------------------------------------------------------------

    def _segment_of(self, location: int) -> Segment:
        return self._segments.by_number(unpack_location(location)[0])

    def _free(self, locations: tuple[int, ...], size: int) -> None:
        for loc in locations:
            number, offset = unpack_location(loc)
            self._segments.by_number(number).allocator.free(offset, size)

    def _drop(self, key: str) -> tuple[int, ...]:
        """COMPLETE -> ABSENT, freeing its space; returns the locations it had."""
        entry = self._index.remove(key)
        self._leases.release(key)
        locations = entry.replicas()
        for loc in locations:
            self._tier_counters[self._segment_of(loc).info.tier, "blocks"] -= 1
        self._free(locations, entry.size)
        return locations

    def _revoke(self, key: str) -> None:
        put = self._index.abandon(key)
        self._free(put.locations, put.size)
        self._counters["revoked_puts"] += 1

    def _drop_segment_replicas(self, seg: Segment) -> int:
        affected = [(k, locs) for k, locs, _ in self._index.all_locations()
                    if any(unpack_location(loc)[0] == seg.number for loc in locs)]
        for key, locs in affected:
            keep = tuple(loc for loc in locs if unpack_location(loc)[0] != seg.number)
            complete = self._index.is_complete(key)
            if complete:
                self._tier_counters[seg.info.tier, "blocks"] -= len(locs) - len(keep)
            if keep:
                self._index.set_replicas(key, keep)
            elif complete:
                self._index.remove(key)
                self._leases.release(key)
            else:
                self._index.abandon(key)
        return len(affected)

    # -- introspection --------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._lock:
            segs = self._segments.segments()
            tiers = []
            for tier in Tier:
                in_tier = [s for s in segs if s.info.tier == tier]
                if not in_tier and not self._tier_counters[tier, "blocks"]:
                    continue
                c = {name: self._tier_counters[tier, name]
                     for name in ("blocks", "hits", "evictions", "demotions", "promotions")}
                tiers.append(TierStats(tier, sum(s.allocator.capacity for s in in_tier),
                                       sum(s.allocator.used for s in in_tier), **c))
            daemons = tuple(DaemonStats(d.daemon_id, d.last_heartbeat,
                                        tuple(self._segments.get(s).info for s in sorted(d.segment_ids)))
                            for d in self._segments.daemons())
            return StoreStats(keys=len(self._index), pending=self._index.pending_count,
                              capacity=sum(s.allocator.capacity for s in segs),
                              used=sum(s.allocator.used for s in segs),
                              evictions=self._counters["evictions"],
                              revoked_puts=self._counters["revoked_puts"],
                              leased=len(self._leases), tiers=tuple(tiers), daemons=daemons)

    def check_invariants(self) -> None:
        """Index consistent; every replica in a mounted segment; allocators agree with the index."""
        with self._lock:
            self._index.check_invariants()
            by_segment: dict[int, list[tuple[int, int]]] = {s.number: [] for s in self._segments.segments()}
            for key, locations, size in self._index.all_locations():
                numbers = [unpack_location(loc)[0] for loc in locations]
                assert len(set(numbers)) == len(numbers), f"{key}: two replicas in one segment"
                for loc in locations:
                    number, offset = unpack_location(loc)
                    assert number in by_segment, f"{key}: replica in unmounted segment {number}"
                    by_segment[number].append((offset, size))
            daemons_of = {}
            for seg in self._segments.segments():
                seg.allocator.check_invariants(by_segment[seg.number])
                daemons_of.setdefault(seg.number, seg.daemon_id)
            for key, locations, _ in self._index.all_locations():
                owners = [daemons_of[unpack_location(loc)[0]] for loc in locations]
                assert len(set(owners)) == len(owners), f"{key}: two replicas on one daemon"
            for key in self._leases.keys():
                assert self._index.is_complete(key), f"lease on {key!r}, which is not COMPLETE"


def _validate_keys(keys: Sequence[str]) -> None:
    for key in keys:
        validate_key(key)


