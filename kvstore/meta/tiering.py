"""Moving blocks between tiers: demotion of cold DRAM blocks to SSD, promotion of hot SSD blocks
back to DRAM, and the SSD tier's own LRU deletion.

The service never touches bytes: a daemon claims move tasks whose source and destination are both
its own segments, copies locally, and reports back. Only then is the replica switched in the index
and the source freed (copy, then switch), so a reader sees either the old place or the new one,
never a half-moved block. Leased, pinned and moving blocks are never chosen; a move whose block
was read (leased), removed or lost meanwhile is abandoned and its destination freed.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Iterator

from kvstore.config import MetaConfig
from kvstore.meta.eviction import EvictionPolicy
from kvstore.meta.index import Entry
from kvstore.meta.segments import pack_location, unpack_location
from kvstore.meta.state import MetaState
from kvstore.types import MoveKind, MoveTask, Tier

log = logging.getLogger(__name__)
_MAX_TRACKED_HITS = 100_000


@dataclass(frozen=True)
class _Move:
    task: MoveTask
    src: int
    dst: int
    daemon_id: str
    deadline: float


class Tiering:
    def __init__(self, config: MetaConfig, state: MetaState, policy: EvictionPolicy) -> None:
        self.config = config
        self._st = state
        self._policy = policy
        self._moves: dict[int, _Move] = {}
        self._ids = itertools.count(1)
        self._ssd_hits: Counter[str] = Counter()
        self._promote: dict[str, None] = {}      # insertion-ordered set of keys to bring back
        self._pressure: dict[str, int] = {}      # daemon -> DRAM bytes puts are waiting for

    # -- signals from the read and write paths ---------------------------------------------------

    def note_ssd_read(self, key: str) -> None:
        """Count a read of a block that lives only on SSD; hot ones are queued for promotion."""
        if len(self._ssd_hits) > _MAX_TRACKED_HITS:
            self._ssd_hits.clear()
        self._ssd_hits[key] += 1
        if self._ssd_hits[key] >= self.config.promote_after_hits:
            self._promote[key] = None

    def want_room(self, size: int, now: float) -> bool:
        """A put found DRAM full. True if demotion can make room (the put should retry soon)."""
        ssd_daemons = self._st.ssd_daemons()
        if not ssd_daemons:
            return False
        skip = self._st.protected(now)
        for key, entry in self._st.index.least_recent():
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
        """Move tasks for `daemon_id` worth up to `max_bytes`: demotions while its DRAM is above the
        high watermark (or puts wait for room), then promotions while DRAM has room."""
        tasks = self._demotions(daemon_id, max_bytes, now)
        budget = max_bytes - sum(t.size for t in tasks)
        return tasks + self._promotions(daemon_id, budget, now)

    def _demotions(self, daemon_id: str, budget: int, now: float) -> list[MoveTask]:
        used, capacity = self._st.usage(Tier.DRAM, daemon_id)
        in_flight = sum(m.task.size for m in self._moves.values()
                        if m.daemon_id == daemon_id and m.task.kind is MoveKind.DEMOTE)
        over = used - int(capacity * self.config.low_watermark) if used > capacity * self.config.high_watermark else 0
        need = max(over, self._pressure.pop(daemon_id, 0)) - in_flight
        if need <= 0:
            return []
        protected = self._st.protected(now)
        local = {s.number for s in self._st.segments.segments(Tier.DRAM) if s.daemon_id == daemon_id}
        skip = lambda key: protected(key) or self._local_replica(key, local) is None  # noqa: E731
        tasks = []
        for key in self._policy.victims(self._st.index, skip, min(need, budget)):
            entry = self._st.index.get(key)
            src = self._local_replica(key, local)
            placed = self._st.segments.place_on(daemon_id, Tier.SSD, entry.size) \
                or self._make_ssd_room(daemon_id, entry.size, now)
            if placed is None:            # SSD full of protected blocks: the DRAM copy must go
                self._st.evict([key])
                continue
            tasks.append(self._start(MoveKind.DEMOTE, key, entry, src, placed, daemon_id, now))
        return tasks

    def _promotions(self, daemon_id: str, budget: int, now: float) -> list[MoveTask]:
        tasks = []
        for key in list(self._promote):
            if budget <= 0:
                break
            entry = self._st.index.get(key)
            if entry is None or key in self._st.moving:
                self._promote.pop(key, None)
                continue
            src = next((l for l in entry.replicas() if self._st.tier_of(l) is Tier.SSD
                        and self._st.segment_of(l).daemon_id == daemon_id), None)
            if src is None:
                continue                   # another daemon holds it
            used, capacity = self._st.usage(Tier.DRAM, daemon_id)
            if used + entry.size > capacity * self.config.high_watermark:
                break                      # promoting would only force a demotion
            placed = self._st.segments.place_on(daemon_id, Tier.DRAM, entry.size)
            if placed is None:
                break
            del self._promote[key]
            tasks.append(self._start(MoveKind.PROMOTE, key, entry, src, placed, daemon_id, now))
            budget -= entry.size
        return tasks

    def _make_ssd_room(self, daemon_id: str, size: int, now: float):
        """Delete least recently used SSD-only blocks of this daemon until `size` fits."""
        protected = self._st.protected(now)
        local = {s.number for s in self._st.segments.segments(Tier.SSD) if s.daemon_id == daemon_id}
        skip = lambda key: protected(key) or not self._only_on(key, local)  # noqa: E731
        while True:
            victims = self._policy.victims(self._st.index, skip, size)
            if not victims:
                return None
            self._st.evict(victims)
            placed = self._st.segments.place_on(daemon_id, Tier.SSD, size)
            if placed is not None:
                return placed

    def _start(self, kind: MoveKind, key: str, entry: Entry, src: int, placed, daemon_id: str,
               now: float) -> MoveTask:
        seg, offset = placed
        src_seg = self._st.segment_of(src)
        task = MoveTask(next(self._ids), kind, key, src_seg.segment_id, unpack_location(src)[1],
                        seg.segment_id, offset, entry.size, entry.checksum)
        self._moves[task.move_id] = _Move(task, src, pack_location(seg.number, offset), daemon_id,
                                          now + self.config.move_timeout_s)
        self._st.moving[key] = task.move_id
        return task

    def complete(self, daemon_id: str, results: list[tuple[int, bool, str]], now: float) -> None:
        """Switch each successfully copied block to its new place; abandon the others."""
        for move_id, ok, error in results:
            move = self._moves.get(move_id)
            if move is None or move.daemon_id != daemon_id:
                continue
            del self._moves[move_id]
            reason = error if not ok else self._cannot_switch(move, now)
            if reason:
                self._abandon(move, reason)
            else:
                self._switch(move)

    def _cannot_switch(self, move: _Move, now: float) -> str:
        key = move.task.key
        if self._st.moving.get(key) != move.task.move_id:
            return "the block was removed or replaced meanwhile"
        entry = self._st.index.get(key)
        if entry is None or move.src not in entry.replicas():
            return "the source replica is gone"
        if not self._alive(move.dst, move.task.dst_segment_id):
            return "the destination segment is gone"
        if self._st.leases.held(key, now):
            return "the block is being read"
        return ""

    def _switch(self, move: _Move) -> None:
        key, size = move.task.key, move.task.size
        entry = self._st.index.get(key)
        self._st.index.set_replicas(key, tuple(move.dst if l == move.src else l for l in entry.replicas()))
        self._st.count_blocks((move.src,), -1)
        self._st.count_blocks((move.dst,), +1)
        self._st.free((move.src,), size)
        self._st.moving.pop(key, None)
        if move.task.kind is MoveKind.DEMOTE:
            self._st.tier_counters[Tier.SSD, "demotions"] += 1
        else:
            self._st.tier_counters[Tier.DRAM, "promotions"] += 1
            self._ssd_hits.pop(key, None)

    def _abandon(self, move: _Move, reason: str) -> None:
        log.info("move %d of %r abandoned: %s", move.task.move_id, move.task.key, reason)
        if self._alive(move.dst, move.task.dst_segment_id):
            self._st.free((move.dst,), move.task.size)
        if self._st.moving.get(move.task.key) == move.task.move_id:
            del self._st.moving[move.task.key]
        self._st.counters["moves_abandoned"] += 1

    def expire(self, now: float) -> None:
        """Abandon moves whose daemon never reported back."""
        for move_id in [i for i, m in self._moves.items() if m.deadline < now]:
            self._abandon(self._moves.pop(move_id), "not reported within move_timeout_s")

    def enforce_watermark(self, tier: Tier, high: float, low: float, now: float) -> None:
        """Delete least recently used blocks held only in `tier` while it is above `high`. Used for
        the bottom tier (SSD) and for GPU, whose blocks are not demoted."""
        used, capacity = self._st.usage(tier)
        if not capacity or used <= capacity * high:
            return
        numbers = {s.number for s in self._st.segments.segments(tier)}
        protected = self._st.protected(now)
        skip = lambda key: protected(key) or not self._only_on(key, numbers)  # noqa: E731
        self._st.evict(self._policy.victims(self._st.index, skip, used - int(capacity * low)))

    # -- helpers -----------------------------------------------------------------------------------

    def _alive(self, location: int, segment_id: str) -> bool:
        seg = self._st.segments.get(segment_id)
        return seg is not None and seg.number == unpack_location(location)[0]

    def _local_replica(self, key: str, numbers: set[int]) -> int | None:
        entry = self._st.index.get(key)
        return next((l for l in entry.replicas() if unpack_location(l)[0] in numbers), None)

    def _only_on(self, key: str, numbers: set[int]) -> bool:
        return all(unpack_location(l)[0] in numbers for l in self._st.index.get(key).replicas())

    def destinations(self) -> Iterator[tuple[int, int]]:
        """(location, size) of every move's reserved destination, for invariant checks."""
        for m in self._moves.values():
            if self._alive(m.dst, m.task.dst_segment_id):
                yield m.dst, m.task.size

    def in_flight(self) -> int:
        return len(self._moves)
