"""MetaStore: the metadata service's logic as a plain, thread-safe class (no gRPC here): the API over MetaState's
tables; the per-key work of puts and gets in writes.py and reads.py, regions in regions.py, tier moves in tiering.py.
Every public method takes the one lock, reads the injected clock, and leaves `check_invariants()` true. A batch is
worked through in slices of SLICE keys, releasing the lock between them: a caller with a batch of MAX_BATCH_KEYS
holds no other caller up for more than one slice."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from kvstore.clock import Clock, SystemClock
from kvstore.config import MetaConfig
from kvstore.errors import InvalidArgument
from kvstore.grant import GrantSigner
from kvstore.meta import entry, eviction, forgets, inspect, listing, pins, recovery, tierpolicy, upkeep
from kvstore.meta.gate import WriteGate
from kvstore.meta.holds import HoldRecord
from kvstore.meta.journal import Journal, NoJournal
from kvstore.meta.reads import Reads
from kvstore.meta.records import ObjectRecord, SegmentRecord, Unreadable
from kvstore.meta.recovery import Restored
from kvstore.meta.regions import RegionCalls, Regions
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import TenantRegistry
from kvstore.meta.tiering import Tiering
from kvstore.meta.writes import Writes
from kvstore.results import (
    Block,
    GetReply,
    GetResult,
    KeyInfo,
    KeyListing,
    KeyResult,
    MoveOutcome,
    PutEndReply,
    PutStartReply,
    PutStartResult,
    PutWritten,
    StoreStats,
)
from kvstore.types import MAX_BATCH_KEYS, MoveTask, SegmentInfo, Tier, validate_key, validate_keys

log = logging.getLogger(__name__)

SLICE = 64  # keys of a batch handled per lock hold
T = TypeVar("T")


class MetaStore:
    def __init__(
        self,
        config: MetaConfig,
        signer: GrantSigner,
        clock: Clock | None = None,
        policy: eviction.EvictionPolicy | None = None,
        journal: Journal | None = None,
        grant_ceiling: Callable[[], float] | None = None,
    ) -> None:
        self.config = config
        self._signer = signer
        self._clock = clock or SystemClock()
        self._journal: Journal = journal or NoJournal()
        self._st = MetaState(grant_ceiling)
        self._policies = tierpolicy.build(config, self._st.index, policy)
        self._st.tracking = self._journal.durable
        self._gate = WriteGate(config, self._clock, self._journal)
        self._tiering = Tiering(config, self._st, self._policies, signer)
        self._forgets = forgets.SsdForgets(self._st, config.move_timeout_s)  # deletions SSD journals must hear of
        self._writes = Writes(config, self._st, signer, self._policies.evicts(Tier.DRAM), self._tiering)
        self._reads = Reads(config, self._st, signer, self._tiering)
        self._lock = threading.RLock()
        self.regions = RegionCalls(Regions(config, self._st, signer), self._lock, self._gate, self._clock, self._sliced)

    def _sliced(self, n: int, work: Callable[[range, float], list[T]], changes: bool = False) -> list[T]:
        """work(indices, now) for each slice of range(n), each under the lock; other callers
        get their turn between slices. With `changes`, what each slice changed is journaled, and
        this returns once all of it is durable."""
        out: list[T] = []
        ticket = 0
        for start in range(0, max(n, 1), SLICE):
            with self._lock:
                out += work(range(start, min(n, start + SLICE)), self._clock.now())
                if changes:
                    ticket = self._journal.submit(self._st.take_changes())
            if start + SLICE < n:
                time.sleep(0)  # let a caller waiting for the lock take it
        if changes:
            self._journal.wait(ticket)
        return out

    def _journaled(self) -> int:
        """Hand what the caller changed to the journal (under the lock); wait on the ticket after."""
        return self._journal.submit(self._st.take_changes())

    def writes_open(self) -> bool:
        return self._gate.is_open()

    def takeover_wait_s(self) -> float:
        return self._gate.wait_s

    # -- segments and daemons -------------------------------------------------------------------

    def mount_segment(self, info: SegmentInfo) -> None:
        """Add a segment. A persistent segment re-mounted by a restarted daemon replaces the old
        mount (whose replicas are dropped; the daemon re-announces what survived); a segment
        loaded from the journal is confirmed by its daemon mounting it again."""
        with self._lock:
            old = self._st.segments.get(info.segment_id)
            if old is not None and old.daemon_id != info.daemon_id:
                log.warning("segment %s moves from daemon %s to %s", info.segment_id, old.daemon_id, info.daemon_id)
                self._forgets.unmount(old.segment_id)
            confirming = old is not None and not old.confirmed
            self._forgets.mount(info, self._clock.monotonic())
            if self._st.tracking:
                self._st.changed_segments.add(info.segment_id)
            ticket = self._journaled()
            what = "confirmed" if confirming else "mounted"
            log.info("%s segment %s of daemon %s (%s, %d bytes)", what, info.segment_id, info.daemon_id,
                     info.tier.value, info.capacity)  # fmt: skip
        self._journal.wait(ticket)

    def unmount_segment(self, segment_id: str) -> int:
        """Forget a segment and every replica in it; returns how many replicas were dropped."""
        with self._lock:
            dropped = self._forgets.unmount(segment_id)
            ticket = self._journaled()
        self._journal.wait(ticket)
        return dropped

    def heartbeat(self, daemon_id: str, segment_ids: Sequence[str]) -> list[str]:
        """Record liveness; returns the ids among `segment_ids` that the daemon must mount (again):
        not mounted, or loaded from the journal and not yet confirmed."""
        with self._lock:
            self._st.segments.heartbeat(daemon_id, self._clock.monotonic())
            return [s for s in segment_ids if (seg := self._st.segments.get(s)) is None or not seg.confirmed]

    def announce(self, segment_id: str, blocks: Sequence[Block]) -> list[KeyResult]:
        """Register blocks a restarted daemon found intact in a mounted persistent segment; keys
        stored already, and blocks dropped since the daemon journaled them (forgets.py), are not."""
        self._gate.check()
        for block in blocks:
            validate_key(block.key, internal=True)
        with self._lock:
            results = self._forgets.announce(segment_id, blocks, self._writes.announce)
            ticket = self._journaled()
        self._journal.wait(ticket)
        return results

    def restore(
        self,
        segments: Iterable[SegmentRecord | Unreadable],
        objects: Iterable[tuple[str, ObjectRecord] | Unreadable],
        pins: Iterable[tuple[str, float] | Unreadable],
        tenants: dict[str, bytes] | None = None,
        first: bool = False,
        holds: Iterable[HoldRecord | Unreadable] = (),
    ) -> Restored:
        """Load a journal's records into this (empty) store as a service taking over (recovery.py): space its
        predecessor's grants may reach waits until they expire (none before the `first` leader)."""
        with self._lock:
            mono, now = self._clock.monotonic(), self._clock.now()
            until = 0.0 if first else now + self._gate.grants_s
            self._st.inherited_until = until
            report = recovery.restore(self._st, segments, objects, pins, tenants or {}, now, mono, holds, until)
            self._gate.took_over(mono)
            ticket = self._journaled()  # records found unusable are forgotten
        self._journal.wait(ticket)
        return report

    @property
    def reconciling(self) -> int:
        """Segments loaded from the journal that their daemons have not mounted again (not set aside) yet."""
        with self._lock:
            return sum(not seg.set_aside for seg in self._st.segments.unconfirmed())

    # -- puts -----------------------------------------------------------------------------------

    def put_start(
        self, keys: Sequence[str], sizes: Sequence[int], replica_num: int = 1, client_host: str = ""
    ) -> PutStartReply:
        """Reserve space for each key and return write grants; ALREADY_EXISTS for complete keys."""
        validate_keys(keys, internal=True)
        if len(sizes) != len(keys):
            raise InvalidArgument(f"{len(keys)} keys but {len(sizes)} sizes")
        if any(s <= 0 for s in sizes):
            raise InvalidArgument("every value must be at least 1 byte")
        if not 1 <= replica_num <= entry.MAX_REPLICAS:
            raise InvalidArgument(f"replica_num must be 1 to {entry.MAX_REPLICAS}")
        self._gate.check()
        segments: dict[str, SegmentInfo] = {}

        def work(part: range, now: float) -> list[PutStartResult]:
            results = [self._writes.start(keys[i], sizes[i], replica_num, client_host, now) for i in part]
            upkeep.evict_to_watermarks(self._st, self._tiering, self._policies.evicts(Tier.DRAM), self.config, now)
            segments.update(self._st.segments.named_by(results))
            return results

        # Journaled before answering: space freed by an eviction here, or by an earlier call still
        # writing, is granted only once its old owner's removal is durable.
        return PutStartReply(tuple(self._sliced(len(keys), work, changes=True)), segments)

    def put_end(
        self,
        keys: Sequence[str],
        checksums: Sequence[int],
        written: Sequence[PutWritten] = (),
        failed_segments: Sequence[str] = (),
        unchecked_ok: bool = False,
    ) -> PutEndReply:
        """PENDING -> COMPLETE for each key, with the replicas the writer reports written (Writes.end)."""
        validate_keys(keys, internal=True)
        if len(checksums) != len(keys) or (written and len(written) != len(keys)):
            raise InvalidArgument(f"{len(keys)} keys but {len(checksums)} checksums and {len(written)} reports")
        entry.check_checksums(checksums)
        self._gate.check()
        if failed_segments:
            with self._lock:
                self._writes.reported(keys, failed_segments, self._clock.now())

        def work(part: range, now: float) -> list[tuple[KeyResult, int]]:
            end, none = self._writes.end, [None] * len(keys)
            return [end(keys[i], checksums[i], (written or none)[i], now, unchecked_ok) for i in part]

        done = self._sliced(len(keys), work, changes=True)
        return PutEndReply(tuple(r for r, _ in done), tuple(n for _, n in done))

    def put_revoke(self, keys: Sequence[str], failed_segments: Sequence[str] = ()) -> list[KeyResult]:
        validate_keys(keys, internal=True)
        with self._lock:
            now = self._clock.now()
            self._writes.reported(keys, failed_segments, now)
            return [self._writes.revoke(key, now) for key in keys]  # pending puts are not journaled

    # -- reads ----------------------------------------------------------------------------------

    def get(
        self,
        keys: Sequence[str],
        released: Sequence[int] = (),
        client_host: str = "",
        client_id: str = "",
        failed_segments: Sequence[str] = (),
        touched: Sequence[str] = (),
    ) -> GetReply:
        """Read grants for each key's replicas, and a read lease that keeps them in place (its id comes back in
        `released` of a later Get or Remove once the reader, `client_id`, is done); `touched`: keys the reader read
        again from cached locations, marked recently used."""
        validate_keys(keys, internal=True)
        with self._lock:
            now = self._clock.now()
            self._writes.suspect(self._reads.leased_in(client_id, failed_segments, now), now)  # before the release
            self._st.end_leases(released, client_id, now)
            self._reads.touched(touched[:MAX_BATCH_KEYS])
        segments: dict[str, SegmentInfo] = {}

        def work(part: range, now: float) -> list[GetResult]:
            until = min(now + self.config.lease_ttl_s, self._st.grant_ceiling())  # what a successor waits out
            results = [self._reads.get(keys[i], until, client_host, client_id, now) for i in part]
            segments.update(self._st.segments.named_by(results))
            return results

        results = self._sliced(len(keys), work) if keys else []
        return GetReply(tuple(results), segments, int(self.config.lease_ttl_s * 1000))

    def release(self, released: Sequence[int], client_id: str = "") -> None:
        """Readers are done with these read leases (as a Get's `released` says)."""
        with self._lock:
            self._st.end_leases(released, client_id, self._clock.now())

    def exists(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is COMPLETE. Takes no lease: polling must not block eviction."""
        validate_keys(keys, internal=True)
        return self._sliced(len(keys), lambda part, now: [self._st.index.is_complete(keys[i]) for i in part])

    def match_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys are COMPLETE. Takes no lease."""
        validate_keys(keys, internal=True)
        is_complete = self._st.index.is_complete
        for start in range(0, len(keys), SLICE * 16):  # a cheap call: longer slices
            with self._lock:
                for i in range(start, min(len(keys), start + SLICE * 16)):
                    if not is_complete(keys[i]):
                        return i
        return len(keys)

    # -- pins -----------------------------------------------------------------------------------

    def pin(self, keys: Sequence[str], ttl_s: float) -> list[KeyResult]:
        """Keep COMPLETE keys from eviction and moves for `ttl_s`; NO_SPACE past a tier's pin cap."""
        validate_keys(keys, internal=True)
        if ttl_s <= 0:
            raise InvalidArgument("a pin needs a positive ttl")
        self._gate.check()
        with self._lock:
            results = pins.pin(self._st, keys, ttl_s, self.config.pin_cap, self._clock.now())
            ticket = self._journaled()
        self._journal.wait(ticket)
        return results

    def unpin(self, keys: Sequence[str]) -> list[KeyResult]:
        validate_keys(keys, internal=True)
        self._gate.check()
        with self._lock:
            results = pins.unpin(self._st, keys)
            ticket = self._journaled()
        self._journal.wait(ticket)
        return results

    # -- tier moves and copies (the daemon's side) ----------------------------------------------

    def claim_moves(self, daemon_id: str, max_bytes: int) -> list[MoveTask]:
        if not self._gate.is_open():
            return []  # no space is handed out while changes cannot be kept
        with self._lock:
            if any(s.daemon_id == daemon_id for s in self._st.segments.unconfirmed()):
                return []  # a tier of it is not mounted again since a takeover: moves could only evict
            tasks = self._forgets.claim(daemon_id, self._tiering.claim, max_bytes, self._clock.now())
            ticket = self._journaled()  # SSD room made by deleting blocks
        self._journal.wait(ticket)
        return tasks

    def complete_moves(self, daemon_id: str, results: Sequence[MoveOutcome]) -> None:
        with self._lock:
            self._tiering.complete(daemon_id, self._forgets.settle(daemon_id, results), self._clock.now())
            ticket = self._journaled()
        self._journal.wait(ticket)

    # -- removal and eviction -------------------------------------------------------------------

    def remove(
        self, keys: Sequence[str], force: bool = False, released: Sequence[int] = (), client_id: str = ""
    ) -> list[KeyResult]:
        """Delete keys. A key with read leases running is KEY_BUSY, unless `force`: then it goes at
        once and its space when those leases end. `released`: read leases to end first."""
        validate_keys(keys, internal=True)
        self._gate.check()
        with self._lock:
            self._st.end_leases(released, client_id, self._clock.now())
        return self._sliced(
            len(keys), lambda part, now: [self._reads.remove(keys[i], force, now) for i in part], changes=True
        )

    def tick(self) -> None:
        """Periodic upkeep (upkeep.py), journaled: a tick's changes are durable when it returns."""
        with self._lock:
            now, mono = self._clock.now(), self._clock.monotonic()
            upkeep.expire(self._st, self._tiering, self.config, now)
            self.regions.regions.expire(now)
            upkeep.drop_silent(self._st, self.config, mono, self._forgets.unmount)
            if self._gate.reconcile_due(mono):
                upkeep.drop_unconfirmed(self._st, self.config, mono, self._forgets.unmount)
            if self._gate.is_open():
                upkeep.evict_to_watermarks(self._st, self._tiering, self._policies.evicts(Tier.DRAM), self.config, now)
            ticket = self._journaled()
        self._journal.wait(ticket)

    # -- tenants (tenant_calls.py) ---------------------------------------------------------------------

    @property
    def tenants(self) -> TenantRegistry:
        return self._st.tenants

    def tenant_call(self, work: Callable[[MetaState, float], T], changes: bool = False) -> T:
        """work(state, now) under the lock, for the tenant calls; with `changes`, only while
        writes are open, returning once what it changed is durable."""
        if changes:
            self._gate.check()
        with self._lock:
            out = work(self._st, self._clock.now())
            ticket = self._journaled() if changes else 0
        self._journal.wait(ticket)
        return out

    # -- introspection --------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        with self._lock:
            return inspect.stats(self._st, self._clock.now() - self._clock.monotonic())

    def check_invariants(self) -> None:
        """Index consistent; every replica in a mounted segment, on distinct daemons; allocators
        agree with the index, the moves in flight and the quarantine."""
        with self._lock:
            inspect.check_invariants(self._st, self._tiering, self.regions.regions.spans())
            self._policies.check(self._st.index)

    def list_keys(self, prefix: str = "", limit: int = 0, cursor: str = "", hidden: str = "") -> KeyListing:
        """One page of the COMPLETE keys starting with `prefix` (none starting with `hidden`, if
        given), in byte order, after `cursor`. The lock is held only to snapshot the keys and,
        slice by slice, to read the page's sizes: a long listing holds no other caller up."""
        return listing.list_page(self._st.index, prefix, limit, cursor, hidden, self._sliced)

    def describe(self, keys: Sequence[str]) -> list[KeyInfo]:
        """Per key: state, size, replicas (segment, daemon, tier), and what holds it in place."""
        validate_keys(keys, internal=True)
        return self._sliced(len(keys), lambda part, now: [listing.describe(self._st, keys[i], now) for i in part])
