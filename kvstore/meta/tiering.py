"""Moving blocks between tiers: demotion of cold blocks one tier down (GPU -> DRAM -> SSD) on the
same daemon, promotion of hot ones one tier up (SSD -> DRAM -> GPU), the bottom tiers' own LRU
deletion, and copies for keys that lost replicas.

The service never touches bytes: a daemon claims move tasks whose destination is its own segment
(the source too, for a tier move; another daemon's replica, read under a grant, for a copy),
copies, and reports back. Only then is the replica switched (or added) in the index and the
source freed (copy, then switch), so a reader sees either the old place or the new one, never a
half-moved block. Leased, pinned and moving blocks are never chosen; a move whose block was read
(leased), removed or lost meanwhile is abandoned and its destination freed.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from kvstore.config import MetaConfig
from kvstore.grant import GrantSigner
from kvstore.meta import quotas, replication
from kvstore.meta.index import Entry, SegmentRecency
from kvstore.meta.segments import Segment, pack_location, unpack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import tenant_of
from kvstore.meta.tierpolicy import TierPolicies
from kvstore.results import MoveOutcome
from kvstore.types import GrantMode, MoveKind, MoveTask, Tier

log = logging.getLogger(__name__)
_MAX_TRACKED_HITS = 100_000
_BELOW = {Tier.GPU: Tier.DRAM, Tier.DRAM: Tier.SSD}
_ABOVE = {Tier.SSD: Tier.DRAM, Tier.DRAM: Tier.GPU}


@dataclass(frozen=True)
class _Move:
    task: MoveTask
    src: int
    dst: int
    daemon_id: str
    deadline: float
    src_tier: Tier
    dst_tier: Tier


class Tiering:
    def __init__(self, config: MetaConfig, state: MetaState, policies: TierPolicies, signer: GrantSigner) -> None:
        self.config = config
        self._st = state
        self._policies = policies
        self._signer = signer
        self._moves: dict[int, _Move] = {}
        self._ids = itertools.count(1)
        # per tier a block lives in alone: reads counted, and (insertion-ordered sets of) the keys
        # to bring one tier up
        self._hits: dict[Tier, Counter[str]] = {Tier.SSD: Counter(), Tier.DRAM: Counter()}
        self._promote: dict[Tier, dict[str, None]] = {Tier.SSD: {}, Tier.DRAM: {}}
        self._pressure: dict[str, int] = {}  # daemon -> DRAM bytes puts are waiting for
        self._has_gpu = False  # some daemon offers a GPU tier (refreshed at every claim)

    # -- signals from the read and write paths ---------------------------------------------------

    def note_ssd_read(self, key: str) -> None:
        """Count a read of a block that lives only on SSD; hot ones are queued for promotion."""
        self._note_read(Tier.SSD, key)

    def note_dram_read(self, key: str) -> None:
        """Count a read of a block that lives only in DRAM; where a GPU tier exists, hot ones are
        queued for promotion to it."""
        if self._has_gpu:
            self._note_read(Tier.DRAM, key)

    def _note_read(self, tier: Tier, key: str) -> None:
        hits, queue = self._hits[tier], self._promote[tier]
        if len(hits) > _MAX_TRACKED_HITS:
            hits.clear()
        if len(queue) > _MAX_TRACKED_HITS:  # keys whose daemon has no room above: forget them
            queue.clear()
        hits[key] += 1
        if hits[key] >= self.config.promote_after_hits:
            queue[key] = None

    def want_room(self, size: int, now: float) -> bool:
        """A put found DRAM full. True if demotion can make room (the put should retry soon)."""
        ssd_daemons = self._st.ssd_daemons()
        if not ssd_daemons:
            return False
        skip = self._st.protected(now)
        dram = {s.number for s in self._st.segments.segments(Tier.DRAM) if s.daemon_id in ssd_daemons}
        for key, entry in self._st.index.least_recent_in(dram):
            if skip(key):
                continue
            for loc in entry.replicas():
                seg = self._st.segment_of(loc)
                if seg.info.tier is Tier.DRAM and seg.daemon_id in ssd_daemons:
                    self._pressure[seg.daemon_id] = self._pressure.get(seg.daemon_id, 0) + size
                    return True
        return False

    # -- the daemon's side of a move ---------------------------------------------------------------

    def claim(self, daemon_id: str, max_bytes: int, now: float) -> list[MoveTask]:
        """Move tasks for `daemon_id` worth up to `max_bytes`: demotions while its GPU or DRAM is
        above the high watermark (or puts wait for DRAM), then promotions while the tier above
        has room."""
        self._has_gpu = bool(self._st.segments.segments(Tier.GPU))
        tasks: list[MoveTask] = []
        for step, tier in (
            (self._demotions, Tier.GPU),
            (self._demotions, Tier.DRAM),
            (self._promotions, Tier.SSD),
            (self._promotions, Tier.DRAM),
        ):
            tasks += step(daemon_id, max_bytes - sum(t.size for t in tasks), now, tier)
        return tasks + self._copies(daemon_id, max_bytes - sum(t.size for t in tasks), now)

    def _copies(self, daemon_id: str, budget: int, now: float) -> list[MoveTask]:
        """Copies onto `daemon_id` for keys with fewer replicas than they were put with."""
        if self._st.segments.is_suspect(daemon_id, now):
            return []
        tasks = []
        for key, source, placed in replication.candidates(self._st, daemon_id, budget, now, self.config.high_watermark):
            entry = self._st.index.get(key)
            assert entry is not None
            until = min(now + self.config.move_timeout_s, self._st.grant_ceiling())
            src_seg = self._st.segment_of(source)
            grant = self._signer.sign(
                src_seg.segment_id, unpack_location(source)[1], entry.size, GrantMode.READ, int(until * 1000)
            )
            self._st.note_grant(key, until)
            task = self._start(MoveKind.REPLICATE, key, entry, source, placed, daemon_id, now)
            tasks.append(replace(task, source=grant, source_segment=src_seg.info))
        return tasks

    def _demotions(self, daemon_id: str, budget: int, now: float, tier: Tier) -> list[MoveTask]:
        """Demotions from `tier` (GPU or DRAM) of this daemon to the tier below on it, while
        `tier` is above its high watermark. A block the tier below has no room for is evicted
        (SSD first deletes its own least recently used blocks), unless that tier is DRAM with an
        SSD under it: then DRAM is asked to make room, and the GPU waits for it. The tier below
        takes a block within its tenant's quota there (its own oldest blocks there going first, if
        its policy says so), else the block is evicted; other tenants' reserves in `tier` are spared."""
        used, capacity = self._st.usage(tier, daemon_id)
        if not capacity:
            return []
        local = self._numbers(tier, daemon_id)
        used -= self._st.returning(local)[0]  # evicted, waiting for its last grant: not evicted again
        in_flight = sum(
            m.task.size
            for m in self._moves.values()
            if m.daemon_id == daemon_id and m.task.kind is MoveKind.DEMOTE and m.src_tier is tier
        )
        over = used - int(capacity * self.config.low_watermark) if used > capacity * self.config.high_watermark else 0
        pressure = self._pressure.pop(daemon_id, 0) if tier is Tier.DRAM else 0
        need = max(over, pressure) - in_flight
        if need <= 0:
            return []
        skip = quotas.sparing_reserves(self._st, self._st.protected(now), tier)
        tasks, below = [], _BELOW[tier]
        for key in self._policies.evicts(tier).victims(SegmentRecency(self._st.index, local), skip, min(need, budget)):
            entry = self._st.index.get(key)
            src = self._local_replica(key, local)
            if entry is None or src is None:  # evicted meanwhile, to keep a tenant within its quota below
                continue
            owner, placed = tenant_of(key), None
            admitted = self._policies.admits(below, key)  # else evicted, not written below (--admission)
            # a move counts against its tenant's quota below once it lands: count those on their way
            if admitted and not quotas.make_room(
                self._st, self._policies.evicts(below), owner, below, entry.size + self._moving_to(owner, below), now
            ):
                # making room evicts the tenant's own blocks below: this one too, if it had a copy there
                if self._st.index.get(key) is None:
                    continue
                placed = self._st.segments.place_on(daemon_id, below, entry.size)
                if placed is None and tier is Tier.DRAM:
                    placed = self._make_ssd_room(daemon_id, entry.size, now, owner)
                    if placed is None and self._ssd_returning(daemon_id) >= entry.size:
                        break  # SSD room is on its way back: demote then, rather than drop the block now
                if placed is None and tier is Tier.GPU and daemon_id in self._st.ssd_daemons():
                    # DRAM is full but demotes to SSD: ask it for room (now, below) and wait for it
                    self._pressure[daemon_id] = self._pressure.get(daemon_id, 0) + entry.size
                    break
            if placed is None:  # the tier below is full (of protected blocks), its tenant's quota, or refused it
                self._st.evict([key], now)
                self._st.counters["demotions_refused"] += not admitted
                continue
            tasks.append(self._start(MoveKind.DEMOTE, key, entry, src, placed, daemon_id, now))
        return tasks

    def _promotions(self, daemon_id: str, budget: int, now: float, tier: Tier) -> list[MoveTask]:
        """Promotions of this daemon's hot blocks that live only in `tier` (SSD or DRAM) to the tier
        above on it, while that tier stays below its high watermark."""
        above, queue = _ABOVE[tier], self._promote[tier]
        protected = self._st.protected(now)
        tasks = []
        for key in list(queue):
            if budget <= 0:
                break
            entry = self._st.index.get(key)
            if entry is None or key in self._st.moving:
                queue.pop(key, None)
                continue
            if protected(key):
                continue  # read (the read that made it hot, often) or pinned: a move now would be abandoned
            src = next(
                (
                    l
                    for l in entry.replicas()
                    if self._st.tier_of(l) is tier and self._st.segment_of(l).daemon_id == daemon_id
                ),
                None,
            )
            if src is None:
                continue  # another daemon holds it
            used, capacity = self._st.usage(above, daemon_id)
            if used + entry.size > capacity * self.config.high_watermark:
                break  # promoting would only force a demotion
            owner = tenant_of(key)
            if quotas.over(self._st, owner, above, entry.size + self._moving_to(owner, above)):
                continue  # its tenant has no quota left for it in the tier above
            placed = self._st.segments.place_on(daemon_id, above, entry.size)
            if placed is None:
                break
            del queue[key]
            tasks.append(self._start(MoveKind.PROMOTE, key, entry, src, placed, daemon_id, now))
            budget -= entry.size
        return tasks

    def _make_ssd_room(self, daemon_id: str, size: int, now: float, owner: int) -> tuple[Segment, int] | None:
        """Delete least recently used SSD-only blocks of this daemon until `size` fits (sparing
        other tenants' reserved bytes than `owner`'s)."""
        protected = self._st.protected(now)
        local = self._numbers(Tier.SSD, daemon_id)
        plain = lambda key: protected(key) or not self._only_on(key, local)  # noqa: E731
        # Space evicted earlier that waits for its last grant is room on its way back: once it
        # covers `size`, evicting more would free nothing sooner.
        while self._st.returning(local)[0] < size:
            skip = quotas.sparing_reserves(self._st, plain, Tier.SSD, owner)
            victims = self._policies.evicts(Tier.SSD).victims(SegmentRecency(self._st.index, local), skip, size)
            if not victims:
                return None
            self._st.evict(victims, now)
            placed = self._st.segments.place_on(daemon_id, Tier.SSD, size)
            if placed is not None:
                return placed
        return None

    def _ssd_returning(self, daemon_id: str) -> int:
        return self._st.returning(self._numbers(Tier.SSD, daemon_id))[0]

    def _start(
        self, kind: MoveKind, key: str, entry: Entry, src: int, placed: tuple[Segment, int], daemon_id: str, now: float
    ) -> MoveTask:
        seg, offset = placed
        src_seg = self._st.segment_of(src)
        task = MoveTask(
            next(self._ids),
            kind,
            key,
            src_seg.segment_id,
            unpack_location(src)[1],
            seg.segment_id,
            offset,
            entry.size,
            entry.checksum,
        )
        self._moves[task.move_id] = _Move(
            task,
            src,
            pack_location(seg.number, offset),
            daemon_id,
            now + self.config.move_timeout_s,
            src_seg.info.tier,
            seg.info.tier,
        )
        self._st.moving[key] = task.move_id
        return task

    def complete(self, daemon_id: str, results: Sequence[MoveOutcome], now: float) -> None:
        """Switch each successfully copied block to its new place; abandon the others."""
        for move_id, ok, error in ((r.move_id, r.ok, r.error) for r in results):
            move = self._moves.get(move_id)
            if move is None or move.daemon_id != daemon_id:
                continue
            del self._moves[move_id]
            reason = error if not ok else self._cannot_switch(move, now)
            if reason:
                self._abandon(move, reason, now)
            elif move.task.kind is MoveKind.REPLICATE:
                self._add_replica(move)
            else:
                self._switch(move, now)

    def _cannot_switch(self, move: _Move, now: float) -> str:
        key = move.task.key
        if self._st.moving.get(key) != move.task.move_id:
            return "the block was removed or replaced meanwhile"
        entry = self._st.index.get(key)
        if entry is None:
            return "the block is gone"
        if not self._alive(move.dst, move.task.dst_segment_id):
            return "the destination segment is gone"
        if move.task.kind is MoveKind.REPLICATE:  # the copy was checked against the checksum
            daemons = {self._st.segment_of(loc).daemon_id for loc in entry.replicas()}
            return "the daemon holds a replica already" if move.daemon_id in daemons else ""
        if move.src not in entry.replicas():
            return "the source replica is gone"
        if self._st.leases.held(key, now):
            return "the block is being read"
        return ""

    def _add_replica(self, move: _Move) -> None:
        key = move.task.key
        entry = self._st.index.get(key)
        assert entry is not None
        self._st.index.set_replicas(key, replicas := (*entry.replicas(), move.dst))
        self._st.held(key, (move.dst,), +1, entry.size)
        self._st.moving.pop(key, None)
        self._st.counters["replicas_copied"] += 1
        if len(replicas) >= self._st.under_replicated.get(key, 0):
            self._st.under_replicated.pop(key, None)

    def _switch(self, move: _Move, now: float) -> None:
        key, size = move.task.key, move.task.size
        entry = self._st.index.get(key)
        assert entry is not None
        self._st.index.set_replicas(key, tuple(move.dst if l == move.src else l for l in entry.replicas()))
        self._st.held(key, (move.src,), -1, size)
        self._st.held(key, (move.dst,), +1, size)
        self._st.release((move.src,), size, now, self._st.horizon.get(key, 0.0), {})
        self._st.moving.pop(key, None)
        if move.task.kind is MoveKind.DEMOTE:  # counted where the block arrives
            self._st.tier_counters[move.dst_tier, "demotions"] += 1
        else:
            self._st.tier_counters[move.dst_tier, "promotions"] += 1
            self._hits[move.src_tier].pop(key, None)

    def _abandon(self, move: _Move, reason: str, now: float) -> None:
        log.info("move %d of %r abandoned: %s", move.task.move_id, move.task.key, reason)
        if self._alive(move.dst, move.task.dst_segment_id):  # written by its own daemon, under no grant
            self._st.release((move.dst,), move.task.size, now, 0.0, {})
        if self._st.moving.get(move.task.key) == move.task.move_id:
            del self._st.moving[move.task.key]
        self._st.counters["moves_abandoned"] += 1

    def expire(self, now: float) -> None:
        """Abandon moves whose daemon never reported back."""
        for move_id in [i for i, m in self._moves.items() if m.deadline < now]:
            self._abandon(self._moves.pop(move_id), "not reported within move_timeout_s", now)

    def enforce_watermark(self, tier: Tier, high: float, low: float, now: float) -> None:
        """Delete least recently used blocks held only in `tier` while it is above `high`. Used for
        the bottom tier (SSD), and for GPU segments of daemons without DRAM (the others' GPU
        blocks are demoted to DRAM by the daemons' claims)."""
        keep = {s.daemon_id for s in self._st.segments.segments(Tier.DRAM)} if tier is Tier.GPU else set()
        used, capacity = self._st.usage(tier, exclude=keep)
        numbers = {s.number for s in self._st.segments.segments(tier) if s.daemon_id not in keep}
        used -= self._st.returning(numbers)[0]  # evicted, waiting for its last grant: not evicted again
        if not capacity or used <= capacity * high:
            return
        protected = self._st.protected(now)
        plain = lambda key: protected(key) or not self._only_on(key, numbers)  # noqa: E731
        in_tier, skip = SegmentRecency(self._st.index, numbers), quotas.sparing_reserves(self._st, plain, tier)
        self._st.evict(self._policies.evicts(tier).victims(in_tier, skip, used - int(capacity * low)), now)

    # -- helpers -----------------------------------------------------------------------------------

    def _alive(self, location: int, segment_id: str) -> bool:
        seg = self._st.segments.get(segment_id)
        return seg is not None and seg.number == unpack_location(location)[0]

    def _numbers(self, tier: Tier, daemon_id: str) -> set[int]:
        return {s.number for s in self._st.segments.segments(tier) if s.daemon_id == daemon_id}

    def _local_replica(self, key: str, numbers: set[int]) -> int | None:
        entry = self._st.index.get(key)
        if entry is None:
            return None
        return next((l for l in entry.replicas() if unpack_location(l)[0] in numbers), None)

    def _moving_to(self, tenant: int, tier: Tier) -> int:
        """Bytes of `tenant`'s blocks being moved into `tier` (not yet in its usage there)."""
        if not self._st.tenants.limited:
            return 0
        return sum(m.task.size for m in self._moves.values() if m.dst_tier is tier and tenant_of(m.task.key) == tenant)

    def _only_on(self, key: str, numbers: set[int]) -> bool:
        entry = self._st.index.get(key)
        return entry is not None and all(unpack_location(l)[0] in numbers for l in entry.replicas())

    def destinations(self) -> Iterator[tuple[int, int]]:
        """(location, size) of every move's reserved destination, for invariant checks."""
        for m in self._moves.values():
            if self._alive(m.dst, m.task.dst_segment_id):
                yield m.dst, m.task.size

    def in_flight(self) -> int:
        return len(self._moves)
