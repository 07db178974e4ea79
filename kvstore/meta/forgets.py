"""Deletions the daemons' SSD journals must hear of, so that no dropped block comes back.

A daemon journals every block it writes to a persistent (SSD) segment, and announces what its
journal names again whenever the service has lost track of the segment: after the daemon
restarts, after a heartbeat lapse, at a new leader. A service that remembers nothing (in memory,
restarted) adopts all of it. So whenever the service stops holding a block where a journal may
name it — removed, replaced, evicted, promoted away, or copied there by a move it abandoned — it
owes that daemon a deletion: a FORGET task, claimed with its moves, that the daemon journals and
reports. Until it has, an announcement of that block is refused. A deletion is held back while its
key is being moved, and dropped if the key is back at that very place (the journal's newest record
of the key then names it there), so a late deletion never ends a block written after it.

A service that took over from its own journal (Redis) knows every block its SSD segments hold, and
the deletions the old leader still owed are lost with it: an announcement into such a segment
adopts only what the service holds there. If the segment is dropped before its daemon announced it
(a new daemon mounts it, none does in the reconcile window, or the announcement failed), what it
held is kept aside, and only that may be adopted when it is announced.

Replicas dropped with their segment (`unmount`: the daemon restarted, went silent, or stopped) are
no deletions: the daemon keeps those blocks, and announces them when it mounts the segment again.
The service keeps what it owes a segment until that segment's daemon has journaled it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvstore.errors import ErrorCode
from kvstore.meta.entry import Entry
from kvstore.meta.segments import Segment, pack_location, unpack_location
from kvstore.meta.state import MetaState
from kvstore.results import Block, KeyResult, MoveOutcome
from kvstore.types import MoveKind, MoveTask, SegmentInfo, Tier

MAX_PER_CLAIM = 1024  # FORGET tasks in one claim (a few hundred KiB of reply)
_FIRST_ID = 1 << 62  # FORGET task ids, apart from the moves' (which count up from 1)


class Forget(NamedTuple):
    """A block a persistent segment's journal names, which the service does not hold there."""

    segment_id: str
    offset: int
    key: str
    size: int
    checksum: int


@dataclass
class _Owed:
    forget: Forget
    task_id: int = 0  # claimed as this task (0: waiting)
    daemon_id: str = ""
    deadline: float = 0.0
    again: bool = False  # dropped again while claimed: owed once more when the claim settles


class SsdForgets:
    def __init__(self, st: MetaState, claim_timeout_s: float) -> None:
        """A FORGET task not reported within `claim_timeout_s` is handed out again."""
        self._st = st
        self._timeout_s = claim_timeout_s
        self._ids = itertools.count(_FIRST_ID)
        self._owed: dict[str, dict[tuple[int, str], _Owed]] = {}  # segment id -> (offset, key) -> owed
        self._claimed: dict[int, _Owed] = {}  # task id -> owed
        self._moving: dict[int, Forget] = {}  # move id -> the block a move in flight writes to SSD
        # Segments loaded from the journal (a takeover), until dropped after their daemon announced
        # them: None while their replicas are in the index; once dropped, what they held there
        # (offset -> (key, checksum)).
        self._loaded: dict[str, dict[int, tuple[str, int]] | None] = {}
        self._announced: set[str] = set()  # loaded segments whose daemon announced them
        self._unmounting = False
        st.index.on_lost = self._lost

    # -- segments -----------------------------------------------------------------------------------

    def mount(self, info: SegmentInfo, now: float) -> Segment:
        """SegmentTable.mount; a segment loaded from the journal that its daemon mounts again is
        remembered as loaded."""
        old = self._st.segments.get(info.segment_id)
        if old is not None and not old.confirmed and old.info.tier is Tier.SSD:
            self._loaded.setdefault(old.segment_id, None)
        return self._st.segments.mount(info, now)

    def unmount(self, segment_id: str) -> int:
        """st.unmount of the segment, if mounted: its replicas are dropped, not deleted (its daemon
        keeps the blocks). Returns how many objects lost a replica."""
        seg = self._st.segments.get(segment_id)
        if seg is None:
            return 0
        if not seg.confirmed and seg.info.tier is Tier.SSD:
            self._loaded.setdefault(segment_id, None)
        self._unmounting = True
        try:
            dropped = self._st.unmount(seg)
        finally:
            self._unmounting = False
        if segment_id in self._announced:  # its journal was told what it no longer holds
            self._announced.discard(segment_id)
            del self._loaded[segment_id]
        elif segment_id in self._loaded and self._loaded[segment_id] is None:
            self._loaded[segment_id] = {}  # it held nothing
        return dropped

    def _lost(self, key: str, locations: tuple[int, ...], entry: Entry) -> None:
        """The index's hook: `key` no longer lives at `locations`."""
        for loc in locations:
            number, offset = unpack_location(loc)
            if not self._st.segments.has_number(number):
                continue
            seg = self._st.segments.by_number(number)
            if seg.info.tier is not Tier.SSD:
                continue
            if not self._unmounting:
                self._owe(Forget(seg.segment_id, offset, key, entry.size, entry.checksum))
            elif seg.segment_id in self._loaded:
                held = self._loaded[seg.segment_id]
                if held is None:
                    held = self._loaded[seg.segment_id] = {}
                held[offset] = (key, entry.checksum)

    def _owe(self, forget: Forget) -> None:
        by_block = self._owed.setdefault(forget.segment_id, {})
        owed = by_block.get((forget.offset, forget.key))
        if owed is None:
            by_block[forget.offset, forget.key] = _Owed(forget)
        else:
            owed.forget, owed.again = forget, bool(owed.task_id)

    def _done(self, f: Forget) -> None:
        by_block = self._owed[f.segment_id]
        del by_block[f.offset, f.key]
        if not by_block:
            del self._owed[f.segment_id]

    # -- the daemon's side ------------------------------------------------------------------------

    def claim(
        self, daemon_id: str, claim_moves: Callable[[str, int, float], list[MoveTask]], max_bytes: int, now: float
    ) -> list[MoveTask]:
        """claim_moves(daemon_id, max_bytes, now), after the FORGET tasks for `daemon_id`'s SSD
        segments. A move into SSD is watched: once it settles, unless its block is held there,
        the daemon (which may have journaled the copy) is owed its deletion."""
        moves = claim_moves(daemon_id, max_bytes, now)
        for t in moves:
            seg = self._st.segments.get(t.dst_segment_id)
            if t.kind is not MoveKind.FORGET and seg is not None and seg.info.tier is Tier.SSD:
                self._moving[t.move_id] = Forget(t.dst_segment_id, t.dst_offset, t.key, t.size, t.checksum)
        for move_id, f in list(self._moving.items()):
            if self._st.moving.get(f.key) != move_id:  # switched or abandoned
                del self._moving[move_id]
                if not self._holds(f):
                    self._owe(f)
        for task_id in [i for i, o in self._claimed.items() if o.deadline < now]:
            self._settled(self._claimed.pop(task_id), False)
        return self._take(daemon_id, now + self._timeout_s) + moves

    def _take(self, daemon_id: str, deadline: float) -> list[MoveTask]:
        tasks: list[MoveTask] = []
        for seg in self._st.segments.segments(Tier.SSD):
            if seg.daemon_id != daemon_id or seg.segment_id not in self._owed:
                continue
            for owed in list(self._owed[seg.segment_id].values()):
                f = owed.forget
                if owed.task_id or f.key in self._st.moving:
                    continue  # out already, or held back until its key's move settles
                if self._holds(f):
                    self._done(f)  # back at that very place: the journal's newest record is right
                    continue
                if len(tasks) == MAX_PER_CLAIM:
                    return tasks
                owed.task_id, owed.daemon_id, owed.deadline = next(self._ids), daemon_id, deadline
                self._claimed[owed.task_id] = owed
                tasks.append(MoveTask(owed.task_id, MoveKind.FORGET, f.key, "", 0, f.segment_id, f.offset, f.size,
                                      f.checksum))  # fmt: skip
        return tasks

    def settle(self, daemon_id: str, outcomes: Sequence[MoveOutcome]) -> list[MoveOutcome]:
        """Take the reports of FORGET tasks (one that failed is owed again); returns the others."""
        rest = []
        for outcome in outcomes:
            owed = self._claimed.get(outcome.move_id)
            if owed is None:
                rest.append(outcome)
            elif owed.daemon_id == daemon_id:
                self._settled(self._claimed.pop(outcome.move_id), outcome.ok)
        return rest

    def _settled(self, owed: _Owed, ok: bool) -> None:
        if ok and not owed.again:
            self._done(owed.forget)
        owed.task_id, owed.daemon_id, owed.again = 0, "", False

    # -- announcements ----------------------------------------------------------------------------

    def announce(
        self, segment_id: str, blocks: Sequence[Block], adopt: Callable[[str, Sequence[Block]], list[KeyResult]]
    ) -> list[KeyResult]:
        """adopt(segment_id, blocks) for the blocks of a daemon's announcement that may be adopted;
        the others are refused, and every announced block the segment does not hold afterwards is
        owed a deletion (the journal that named it is out of date)."""
        seg = self._st.segments.get(segment_id)
        if seg is None:
            return adopt(segment_id, blocks)  # refused there, as not mounted
        if segment_id in self._loaded:
            self._announced.add(segment_id)
        refusals = [self._refusal(seg, b) for b in blocks]
        adopted = iter(adopt(segment_id, [b for b, why in zip(blocks, refusals) if not why]))
        results = [KeyResult(ErrorCode.KEY_NOT_FOUND, why) if why else next(adopted) for why in refusals]
        for b in blocks:
            f = Forget(segment_id, b.offset, b.key, b.size, b.checksum)
            if not self._holds(f):
                self._owe(f)
        return results

    def _refusal(self, seg: Segment, block: Block) -> str:
        """Why `block` may not be adopted in `seg` ("" if it may)."""
        owed = self._owed.get(seg.segment_id)
        if owed is not None and (block.offset, block.key) in owed:
            return f"{block.key!r} was dropped from segment {seg.segment_id} since it was journaled there"
        if seg.segment_id not in self._loaded or self._holds(Forget(seg.segment_id, block.offset, block.key, 0, 0)):
            return ""
        held = self._loaded[seg.segment_id]
        if held is not None and held.get(block.offset) == (block.key, block.checksum):
            return ""
        return f"{block.key!r} is not in segment {seg.segment_id} as the journal the service took over has it"

    def _holds(self, f: Forget) -> bool:
        """Whether the service holds `f.key` at that place."""
        seg = self._st.segments.get(f.segment_id)
        entry = self._st.index.get(f.key)
        return seg is not None and entry is not None and pack_location(seg.number, f.offset) in entry.replicas()
