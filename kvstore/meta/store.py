"""MetaStore: the metadata service's logic as a plain, thread-safe class (no gRPC here).

It answers the API (puts, gets, existence, removal, pins, tier moves) over MetaState's tables,
asks the eviction policy what to drop and Tiering what to move. Every public method takes the one
lock, reads the injected clock once, and leaves `check_invariants()` true.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

from kvstore.clock import Clock, SystemClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.grant import GrantSigner
from kvstore.meta import pins
from kvstore.meta.eviction import EvictionPolicy, LRUEviction
from kvstore.meta.index import ObjectState
from kvstore.meta.results import OK, DaemonStats, GetResult, KeyResult, PutStartResult, StoreStats, TierStats
from kvstore.meta.segments import Segment, pack_location, unpack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tiering import Tiering
from kvstore.types import GrantMode, MoveTask, SegmentInfo, Tier, validate_key

log = logging.getLogger(__name__)

# A put is revoked (and a removed block's space freed) this long after its grants expire, so a
# transfer that started just before expiry cannot meet space already handed to another key.
REVOKE_GRACE_S = 2.0
EVICTION_STEP = 0.05   # when out of room, evict at least this share of capacity per round
RETRY_AFTER_MS = 50


class MetaStore:
    def __init__(self, config: MetaConfig, signer: GrantSigner, clock: Clock | None = None,
                 policy: EvictionPolicy | None = None) -> None:
        self.config = config
        self._signer = signer
        self._clock = clock or SystemClock()
        self._policy = policy or LRUEviction()
        self._st = MetaState()
        self._tiering = Tiering(config, self._st, self._policy)
        self._lock = threading.RLock()

    # -- segments and daemons -------------------------------------------------------------------

    def mount_segment(self, info: SegmentInfo) -> None:
        """Add a segment. A persistent segment re-mounted by a restarted daemon replaces the old
        mount (whose replicas are dropped; the daemon re-announces what survived)."""
        with self._lock:
            old = self._st.segments.get(info.segment_id)
            if old is not None and old.daemon_id != info.daemon_id:
                log.warning("segment %s moves from daemon %s to %s", info.segment_id, old.daemon_id,
                            info.daemon_id)
                self._unmount(old)
            self._st.segments.mount(info, self._clock.now())
            log.info("mounted segment %s of daemon %s (%s, %d bytes)", info.segment_id, info.daemon_id,
                     info.tier.value, info.capacity)

    def unmount_segment(self, segment_id: str) -> int:
        """Forget a segment and every replica in it; returns how many replicas were dropped."""
        with self._lock:
            seg = self._st.segments.get(segment_id)
            return 0 if seg is None else self._unmount(seg)

    def _unmount(self, seg: Segment) -> int:
        dropped = self._st.drop_segment_replicas(seg)
        self._st.segments.unmount(seg.segment_id)
        return dropped

    def heartbeat(self, daemon_id: str, segment_ids: Sequence[str]) -> list[str]:
        """Record liveness; returns the ids among `segment_ids` that are not mounted."""
        with self._lock:
            self._st.segments.heartbeat(daemon_id, self._clock.now())
            return [s for s in segment_ids if self._st.segments.get(s) is None]

    def segments(self, segment_ids: Sequence[str]) -> list[SegmentInfo]:
        with self._lock:
            return [s.info for sid in dict.fromkeys(segment_ids) if (s := self._st.segments.get(sid))]

    def announce(self, segment_id: str, blocks: Sequence[tuple[str, int, int, int]]) -> list[KeyResult]:
        """Register (key, offset, size, checksum) blocks a restarted daemon found intact in a
        mounted persistent segment. Keys stored elsewhere already are left as they are."""
        with self._lock:
            seg = self._st.segments.get(segment_id)
            if seg is None:
                raise InvalidArgument(f"segment {segment_id} is not mounted: mount it before announcing")
            results = []
            for key, offset, size, crc in blocks:
                validate_key(key)
                if self._st.index.state(key) is not ObjectState.ABSENT:
                    results.append(KeyResult(ErrorCode.ALREADY_EXISTS, f"{key!r} is already stored"))
                elif size <= 0 or not seg.allocator.reserve(offset, size):
                    results.append(KeyResult(ErrorCode.INVALID_ARGUMENT,
                                             f"[{offset}, +{size}) is not free in segment {segment_id}"))
                else:
                    location = pack_location(seg.number, offset)
                    self._st.index.insert_complete(key, (location,), size, crc)
                    self._st.count_blocks((location,), +1)
                    results.append(OK)
            return results

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
        state = self._st.index.state(key)
        if state is ObjectState.COMPLETE:
            return PutStartResult(ErrorCode.ALREADY_EXISTS, f"{key!r} is already stored")
        if state is ObjectState.PENDING:
            if self._st.index.get_pending(key).deadline + REVOKE_GRACE_S >= now:
                return PutStartResult(ErrorCode.KEY_BUSY, f"another put of {key!r} is in progress; "
                                      "read it once that put ends, or retry the put later")
            self._st.revoke(key)   # a stale put (its writer vanished) must not block the key forever
        largest = max(self._st.segments.largest_capacity(Tier.DRAM), self._st.segments.largest_capacity(Tier.GPU))
        if size > largest:
            return PutStartResult(ErrorCode.INVALID_ARGUMENT,
                                  f"value of {size} bytes is larger than any segment ({largest} bytes); "
                                  "split it into smaller blocks or mount larger segments")
        placed = self._place(size, replica_num, now)
        if not placed:
            if self._tiering.want_room(size, now):
                return PutStartResult(ErrorCode.NO_SPACE, "DRAM is full; blocks are being demoted to SSD: retry",
                                      retry_after_ms=RETRY_AFTER_MS)
            return PutStartResult(ErrorCode.NO_SPACE, f"no room for {size} bytes even after eviction: "
                                  "add daemons or memory, or wait for leases and pins to end")
        deadline = now + self.config.put_lease_ttl_s
        locations = tuple(pack_location(seg.number, off) for seg, off in placed)
        self._st.index.begin_put(key, size, locations, deadline)
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
                if self._st.index.get_pending(key) is None:
                    done = self._st.index.is_complete(key)
                    results.append(OK if done else KeyResult(
                        ErrorCode.KEY_NOT_FOUND, f"no put of {key!r} in progress (revoked after its put "
                        "lease, or its daemon died): put it again"))
                    continue
                self._st.count_blocks(self._st.index.commit(key, crc).replicas(), +1)
                results.append(OK)
            return results

    def put_revoke(self, keys: Sequence[str]) -> list[KeyResult]:
        with self._lock:
            results = []
            for key in keys:
                if self._st.index.get_pending(key) is None:
                    results.append(KeyResult(ErrorCode.KEY_NOT_FOUND, f"no put of {key!r} in progress"))
                else:
                    self._st.revoke(key)
                    results.append(OK)
            return results

    # -- reads ----------------------------------------------------------------------------------

    def get(self, keys: Sequence[str], released: Sequence[int] = ()) -> list[GetResult]:
        """Read grants for each key's replicas, and a read lease that keeps them in place (its id
        comes back in `released` of a later Get or Remove once the reader is done)."""
        _validate_keys(keys)
        with self._lock:
            now = self._clock.now()
            self._st.end_leases(released)
            until = now + self.config.lease_ttl_s
            until_ms, sign = int(until * 1000), self._signer.sign
            results = []
            for key in keys:
                entry = self._st.index.get(key)
                if entry is None:
                    results.append(self._miss(key))
                    continue
                self._st.index.touch(key)
                lease_id = self._st.leases.hold(key, until)
                grants, ssd_only = [], True
                for loc in entry.replicas():
                    seg = self._st.segment_of(loc)
                    tier = seg.info.tier
                    ssd_only = ssd_only and tier is Tier.SSD
                    self._st.tier_counters[tier, "hits"] += 1
                    grants.append(sign(seg.segment_id, unpack_location(loc)[1], entry.size, GrantMode.READ, until_ms))
                if ssd_only:
                    self._tiering.note_ssd_read(key)
                results.append(GetResult(size=entry.size, checksum=entry.checksum, grants=tuple(grants),
                                         lease_id=lease_id))
            return results

    def _miss(self, key: str) -> GetResult:
        if self._st.index.get_pending(key) is not None:
            return GetResult(ErrorCode.KEY_BUSY, f"{key!r} is still being written; retry once its put ends")
        return GetResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not stored (never put, removed, evicted, "
                         "or lost with its daemon); recompute it")

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is COMPLETE. Takes no lease: polling must not block eviction."""
        _validate_keys(keys)
        with self._lock:
            return [self._st.index.is_complete(k) for k in keys]

    def match_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys are COMPLETE. Takes no lease."""
        _validate_keys(keys)
        with self._lock:
            is_complete = self._st.index.is_complete
            for i, key in enumerate(keys):
                if not is_complete(key):
                    return i
            return len(keys)

    # -- pins -----------------------------------------------------------------------------------

    def pin(self, keys: Sequence[str], ttl_s: float) -> list[KeyResult]:
        """Keep COMPLETE keys from eviction and moves for `ttl_s`; NO_SPACE past a tier's pin cap."""
        _validate_keys(keys)
        if ttl_s <= 0:
            raise InvalidArgument("a pin needs a positive ttl")
        with self._lock:
            return pins.pin(self._st, keys, ttl_s, self.config.pin_cap, self._clock.now())

    def unpin(self, keys: Sequence[str]) -> list[KeyResult]:
        with self._lock:
            return pins.unpin(self._st, keys)

    # -- tier moves (the daemon's side) ---------------------------------------------------------

    def claim_moves(self, daemon_id: str, max_bytes: int) -> list[MoveTask]:
        with self._lock:
            return self._tiering.claim(daemon_id, max_bytes, self._clock.now())

    def complete_moves(self, daemon_id: str, results: Sequence[tuple[int, bool, str]]) -> None:
        with self._lock:
            self._tiering.complete(daemon_id, list(results), self._clock.now())

    # -- removal and eviction -------------------------------------------------------------------

    def remove(self, keys: Sequence[str], force: bool = False, released: Sequence[int] = ()) -> list[KeyResult]:
        """Delete keys. A key with read leases running is KEY_BUSY, unless `force`: then it goes at
        once and its space when those leases end. `released`: read leases to end first."""
        _validate_keys(keys)
        with self._lock:
            now = self._clock.now()
            self._st.end_leases(released)
            results = []
            for key in keys:
                state = self._st.index.state(key)
                if state is ObjectState.ABSENT:
                    results.append(KeyResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not stored"))
                elif state is ObjectState.PENDING:
                    results.append(KeyResult(ErrorCode.KEY_BUSY, f"{key!r} is being written; revoke the put "
                                             "or remove it after the put ends"))
                elif self._st.leases.held(key, now) and not force:
                    left = self._st.leases.until(key) - now
                    results.append(KeyResult(ErrorCode.KEY_BUSY, f"{key!r} is being read (lease ends in "
                                             f"{left:.1f} s); retry then, or remove with force"))
                else:
                    self._st.drop(key, now)    # a leased block's space waits for its readers
                    results.append(OK)
            return results

    def tick(self) -> None:
        """Periodic upkeep: revoke expired puts, end leases and pins, abandon stale moves, drop
        silent daemons, evict."""
        with self._lock:
            now = self._clock.now()
            for key in self._st.index.expired_puts(now - REVOKE_GRACE_S):
                log.warning("revoking put of %r: not ended within its %.1f s put lease", key,
                            self.config.put_lease_ttl_s)
                self._st.revoke(key)
            self._st.leases.expire(now)
            self._st.free_retired(now - REVOKE_GRACE_S)   # reads that began just before lease end
            self._st.pins.expire(now)
            self._tiering.expire(now)
            for daemon in self._st.segments.silent_daemons(now, self.config.heartbeat_ttl_s):
                log.warning("daemon %s silent for %.1f s: dropping its %d segments", daemon.daemon_id,
                            now - daemon.last_heartbeat, len(daemon.segment_ids))
                for segment_id in list(daemon.segment_ids):
                    self._unmount(self._st.segments.get(segment_id))
            self._evict_to_watermark(now)

    def _place(self, size: int, replica_num: int, now: float) -> list[tuple[Segment, int]]:
        gpu_used, gpu_capacity = self._st.usage(Tier.GPU)
        if gpu_capacity and gpu_used + size <= gpu_capacity * self.config.high_watermark:
            placed = self._st.segments.place(size, replica_num, Tier.GPU)   # hottest tier first
            if placed:
                return placed
        placed = self._st.segments.place(size, replica_num)
        # Room is made by dropping least recently used blocks, except on daemons with an SSD
        # tier: there blocks are demoted by the daemon (asynchronously; the put is told to retry).
        ssd_daemons = self._st.ssd_daemons()
        capacity = self._st.usage(Tier.DRAM, exclude=ssd_daemons)[1]
        while not placed and capacity:
            victims = self._policy.victims(self._st.index, self._st.droppable(now, ssd_daemons),
                                           max(size, int(capacity * EVICTION_STEP)))
            if not victims:
                return []
            self._st.evict(victims)
            placed = self._st.segments.place(size, replica_num)
        return placed

    def _evict_to_watermark(self, now: float) -> None:
        cfg = self.config
        self._tiering.enforce_watermark(Tier.GPU, cfg.high_watermark, cfg.low_watermark, now)
        self._tiering.enforce_watermark(Tier.SSD, cfg.ssd_high_watermark, cfg.ssd_low_watermark, now)
        ssd_daemons = self._st.ssd_daemons()     # their DRAM is demoted by the daemons' claims
        used, capacity = self._st.usage(Tier.DRAM, exclude=ssd_daemons)
        if capacity and used > capacity * cfg.high_watermark:
            need = used - int(capacity * cfg.low_watermark)
            self._st.evict(self._policy.victims(self._st.index, self._st.droppable(now, ssd_daemons), need))

    # -- introspection --------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._lock:
            st = self._st
            tiers = []
            for tier in Tier:
                used, capacity = st.usage(tier)
                if capacity or st.tier_counters[tier, "blocks"]:
                    c = {n: st.tier_counters[tier, n] for n in ("blocks", "hits", "evictions", "demotions", "promotions")}
                    tiers.append(TierStats(tier, capacity, used, **c))
            daemons = tuple(DaemonStats(d.daemon_id, d.last_heartbeat,
                                        tuple(st.segments.get(s).info for s in sorted(d.segment_ids)))
                            for d in st.segments.daemons())
            segs = st.segments.segments()
            return StoreStats(keys=len(st.index), pending=st.index.pending_count,
                              capacity=sum(s.allocator.capacity for s in segs),
                              used=sum(s.allocator.used for s in segs), evictions=st.counters["evictions"],
                              revoked_puts=st.counters["revoked_puts"], leased=len(st.leases),
                              pinned=len(st.pins), tiers=tuple(tiers), daemons=daemons)

    def check_invariants(self) -> None:
        """Index consistent; every replica in a mounted segment, on distinct daemons; allocators
        agree with the index and the moves in flight."""
        with self._lock:
            st = self._st
            st.index.check_invariants()
            by_segment: dict[int, list[tuple[int, int]]] = {s.number: [] for s in st.segments.segments()}
            daemon_of = {s.number: s.daemon_id for s in st.segments.segments()}
            for key, locations, size in st.index.all_locations():
                numbers = [unpack_location(loc)[0] for loc in locations]
                assert all(n in by_segment for n in numbers), f"{key}: replica in an unmounted segment"
                assert len({daemon_of[n] for n in numbers}) == len(numbers), f"{key}: two replicas on one daemon"
                for loc in locations:
                    by_segment[unpack_location(loc)[0]].append((unpack_location(loc)[1], size))
            moving = list(self._tiering.destinations())
            retired = [(loc, r.size) for r in st.retired for loc in r.locations]
            for loc, size in moving + retired:
                by_segment[unpack_location(loc)[0]].append((unpack_location(loc)[1], size))
            for seg in st.segments.segments():
                seg.allocator.check_invariants(by_segment[seg.number])
            for table in (st.leases, st.pins):
                for key in table.keys():
                    assert st.index.is_complete(key), f"lease or pin on {key!r}, which is not COMPLETE"
            for key in st.moving:
                assert st.index.is_complete(key), f"move of {key!r}, which is not COMPLETE"


def _validate_keys(keys: Sequence[str]) -> None:
    for key in keys:
        validate_key(key)
