"""The service's side of a put, one key at a time, under the store's lock: placement and write
grants (PutStart), commit with what the writer reports of each replica (PutEnd), revocation.

Write grants are LOCAL for replicas the writer reaches over shm (no daemon honours them), and
expire `write_grant_ttl_s` after PutStart. A replica the writer could not write is dropped and
its space freed once its grant can no longer be honoured; a key committed with fewer replicas
than asked is under-replicated (copied again later).

A daemon-checked replica is committed only with the daemon's receipt for exactly its grant:
without one nothing proves a byte was written, and the range may still hold whatever its last
owner (perhaps another tenant) left there. The one exception is a writer trusted with the
transports no daemon checks (shm, mooncake: `unchecked_ok`), which can read those segments
whole anyway; its receipt-less replica keeps its grant live until it expires.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.grant import LOCAL, GrantSigner
from kvstore.meta import quotas
from kvstore.meta.entry import MAX_CHECKSUM
from kvstore.meta.eviction import EvictionPolicy
from kvstore.meta.index import ObjectState, PendingPut
from kvstore.meta.room import Room, make_room
from kvstore.meta.segments import pack_location, unpack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import tenant_of
from kvstore.meta.tiering import Tiering
from kvstore.results import OK, Block, KeyResult, PutStartResult, PutWritten
from kvstore.types import GrantMode, Tier

log = logging.getLogger(__name__)

RETRY_AFTER_MS = 50
REMOUNT_RETRY_MS = 200  # asked again often: a daemon mounts its segments again on its next heartbeat


class Writes:
    def __init__(
        self, config: MetaConfig, state: MetaState, signer: GrantSigner, policy: EvictionPolicy, tiering: Tiering
    ) -> None:
        self.config = config
        self._st = state
        self._signer = signer
        self._policy = policy
        self._tiering = tiering

    def start(self, key: str, size: int, replica_num: int, client_host: str, now: float) -> PutStartResult:
        """Reserve space for `key` and sign its write grants; ALREADY_EXISTS if it is stored."""
        state = self._st.index.state(key)
        if state is ObjectState.COMPLETE:
            return PutStartResult(ErrorCode.ALREADY_EXISTS, f"{key!r} is already stored")
        if state is ObjectState.PENDING:
            pending = self._st.index.get_pending(key)
            assert pending is not None
            if pending.deadline + self._st.quarantine.grace >= now:
                return PutStartResult(
                    ErrorCode.KEY_BUSY,
                    f"another put of {key!r} is in progress; read it once that put ends, or retry the put later",
                )
            self._st.revoke(key, now)  # a stale put (its writer vanished) must not block the key forever
        largest = max(self._st.segments.largest_capacity(Tier.DRAM), self._st.segments.largest_capacity(Tier.GPU))
        if size > largest:
            return PutStartResult(
                ErrorCode.INVALID_ARGUMENT,
                f"value of {size} bytes is larger than any segment ({largest} bytes); "
                "split it into smaller blocks or mount larger segments",
            )
        tenant = tenant_of(key)
        if self._st.tenants.limited:
            room, refusal = self._place_within_quota(size, replica_num, now, tenant)
            if refusal:
                return PutStartResult(ErrorCode.QUOTA_EXCEEDED, refusal)
        else:
            room = self._place(size, replica_num, now, tenant)
        placed = room.placed
        if not placed:
            if self._tiering.want_room(size, now):
                return PutStartResult(
                    ErrorCode.NO_SPACE,
                    "DRAM is full; blocks are being demoted to SSD: retry",
                    retry_after_ms=RETRY_AFTER_MS,
                )
            if room.retry_after_s:
                wait_ms = math.ceil(room.retry_after_s * 1000)
                return PutStartResult(
                    ErrorCode.NO_SPACE,
                    f"no room for {size} bytes now: evicted space is reusable once its last grant ends, "
                    f"in {wait_ms} ms: retry then",
                    retry_after_ms=wait_ms,
                )
            if self._st.segments.unconfirmed():  # a takeover, or silent daemons: set aside until mounted again
                return PutStartResult(
                    ErrorCode.NO_SPACE,
                    f"no room for {size} bytes yet: not every daemon has mounted its segments again since this "
                    "service took over or stopped hearing from it: retry",
                    retry_after_ms=REMOUNT_RETRY_MS,
                )
            return PutStartResult(
                ErrorCode.NO_SPACE,
                f"no room for {size} bytes even after eviction: add daemons or memory, or wait for leases and "
                "pins to end",
            )
        deadline = now + self.config.put_lease_ttl_s
        until_ms = int(min(deadline, now + self.config.write_grant_ttl_s, self._st.grant_ceiling()) * 1000)
        flags = [LOCAL if seg.local_to(client_host) else 0 for seg, _ in placed]
        checked = sum(1 << r for r, f in enumerate(flags) if not f & LOCAL)
        locations = tuple(pack_location(seg.number, off) for seg, off in placed)
        self._st.index.begin_put(
            key, size, locations, deadline, grant_until_ms=until_ms, checked=checked, wanted=replica_num
        )
        grants = tuple(
            self._signer.sign(seg.segment_id, off, size, GrantMode.WRITE, until_ms, f)
            for (seg, off), f in zip(placed, flags, strict=True)
        )
        return PutStartResult(grants=grants)

    def end(
        self, key: str, checksum: int, written: PutWritten | None, now: float, unchecked_ok: bool = False
    ) -> tuple[KeyResult, int]:
        """PENDING -> COMPLETE with the replicas that were written; (outcome, replicas kept).
        `unchecked_ok`: the writer may have used a transport that gives no receipt."""
        put = self._st.index.get_pending(key)
        if put is None:
            entry = self._st.index.get(key)
            if entry is not None:  # an answer that was lost, asked again
                return OK, len(entry.replicas())
            return KeyResult(
                ErrorCode.KEY_NOT_FOUND,
                f"no put of {key!r} in progress (revoked after its put lease, or its daemon died): put it again",
            ), 0
        kept, lost, unproven = self._sort_replicas(put, written, unchecked_ok)
        if not kept:
            self._st.revoke(key, now)
            return KeyResult(
                ErrorCode.KEY_NOT_FOUND,
                f"no replica of {key!r} was written (a daemon-checked replica needs its daemon's receipt): "
                "put it again",
            ), 0
        self._st.index.set_replicas(key, tuple(loc for _, loc in kept))
        entry = self._st.index.commit(key, checksum)
        self._st.held(key, entry.replicas(), +1, entry.size)
        for r, loc in lost:  # a failed write may still have taken its grant
            until = put.grant_until_ms / 1000 if put.checked >> r & 1 else 0.0
            self._st.release((loc,), put.size, now, until, {})
        if unproven:
            self._st.note_grant(key, put.grant_until_ms / 1000)
        if len(kept) < put.wanted:
            self._st.under_replicated[key] = put.wanted
        return OK, len(kept)

    def _sort_replicas(
        self, put: PendingPut, written: PutWritten | None, unchecked_ok: bool
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], bool]:
        """(kept, lost) as (replica, location), and whether a kept daemon-checked grant came
        back without its receipt (only if `unchecked_ok`: else such a replica is lost). Replicas
        in segments that went away are neither."""
        kept, lost, unproven = [], [], False
        receipts = written.receipts if written is not None else ()
        failed = written.failed if written is not None else 0
        for r, loc in enumerate(put.locations):
            number, offset = unpack_location(loc)
            if not self._st.segments.has_number(number):
                continue
            if failed >> r & 1:
                lost.append((r, loc))
                continue
            if put.checked >> r & 1:
                seg = self._st.segments.by_number(number)
                grant = self._signer.sign(seg.segment_id, offset, put.size, GrantMode.WRITE, put.grant_until_ms)
                if not self._signer.receipt_ok(grant, receipts[r] if r < len(receipts) else b""):
                    if not unchecked_ok:
                        lost.append((r, loc))
                        continue
                    unproven = True
            kept.append((r, loc))
        return kept, lost, unproven

    def announce(self, segment_id: str, blocks: Sequence[Block]) -> list[KeyResult]:
        """Adopt blocks a daemon found intact in a persistent segment, where the range is free."""
        seg = self._st.segments.get(segment_id)
        if seg is None:
            raise InvalidArgument(f"segment {segment_id} is not mounted: mount it before announcing")
        results = []
        for block in blocks:
            if self._st.index.state(block.key) is not ObjectState.ABSENT:
                results.append(KeyResult(ErrorCode.ALREADY_EXISTS, f"{block.key!r} is already stored"))
            elif not 0 <= block.checksum <= MAX_CHECKSUM:  # checked before its range is taken
                results.append(KeyResult(ErrorCode.INVALID_ARGUMENT, f"{block.key!r}: checksum out of 64 bits"))
            elif block.size <= 0 or not seg.allocator.reserve(block.offset, block.size):
                results.append(
                    KeyResult(
                        ErrorCode.INVALID_ARGUMENT,
                        f"[{block.offset}, +{block.size}) is not free in segment {segment_id}",
                    )
                )
            else:
                location = pack_location(seg.number, block.offset)
                self._st.index.insert_complete(block.key, (location,), block.size, block.checksum)
                self._st.held(block.key, (location,), +1, block.size)
                results.append(OK)
        return results

    def revoke(self, key: str, now: float) -> KeyResult:
        if self._st.index.get_pending(key) is None:
            return KeyResult(ErrorCode.KEY_NOT_FOUND, f"no put of {key!r} in progress")
        self._st.revoke(key, now)
        return OK

    def reported(self, keys: Sequence[str], failed_segments: Sequence[str], now: float) -> None:
        """A writer's report of failed transfers: it counts only where these puts were placed."""
        if failed_segments:
            self.suspect(self._placed_in(keys, failed_segments), now)

    def _placed_in(self, keys: Sequence[str], segment_ids: Sequence[str]) -> list[str]:
        numbers: set[int] = set()
        for key in keys:
            put = self._st.index.get_pending(key)
            if put is not None:
                numbers.update(unpack_location(loc)[0] for loc in put.locations)
        return [sid for sid in segment_ids if (seg := self._st.segments.get(sid)) is not None and seg.number in numbers]

    def suspect(self, failed_segments: Sequence[str], now: float) -> None:
        """A client's transfers to these segments failed: place nothing on their daemons for a
        while (until they mount again, or the suspicion runs out)."""
        for daemon_id in self._st.segments.suspect(failed_segments, now + self.config.suspect_ttl_s):
            log.warning(
                "daemon %s failed a client's transfer: avoided for %.0f s", daemon_id, self.config.suspect_ttl_s
            )

    def _place_within_quota(self, size: int, replica_num: int, now: float, tenant: int) -> tuple[Room, str]:
        """Placement for a tenant with quotas: GPU only within its GPU quota, DRAM after making
        room within its DRAM quota (its own blocks first); (placement, why it is refused)."""
        need = size * replica_num
        gpu = not quotas.over(self._st, tenant, Tier.GPU, need)
        refusal = quotas.make_room(self._st, self._policy, tenant, Tier.DRAM, need, now)
        if not refusal:
            return self._place(size, replica_num, now, tenant, gpu=gpu), ""
        room = self._place(size, replica_num, now, tenant, dram=False) if gpu else Room()
        return room, "" if room.placed else refusal

    def _place(self, size: int, replica_num: int, now: float, tenant: int, gpu: bool = True, dram: bool = True) -> Room:
        # The hottest tier first, filled as DRAM is: past its high watermark its least recently used
        # blocks are demoted to DRAM (tiering.py), so the GPU holds the newest and the promoted.
        segments = self._st.segments
        gpu_used, gpu_capacity = self._st.usage(Tier.GPU)
        if gpu and gpu_capacity and gpu_used + size <= gpu_capacity:
            placed = segments.place(size, replica_num, Tier.GPU, now)
            if placed:
                return Room(placed)
        if not dram:
            return Room()
        # Daemons under suspicion (a client just failed to reach them: likely dead) are not given a
        # block while there is room, or room can be made, on the others: a put placed there may fail.
        placed = segments.place(size, replica_num, Tier.DRAM, now, suspects=False)
        if placed:
            return Room(placed)
        # Room is made by dropping least recently used blocks, except on daemons with an SSD tier:
        # there blocks are demoted by the daemon (asynchronously; the put is told to retry). Other
        # tenants keep their reserved bytes.
        droppable = {s.daemon_id for s in segments.usable(Tier.DRAM)} - self._st.ssd_daemons()
        trusted = frozenset(d for d in droppable if not segments.is_suspect(d, now))
        room = make_room(self._st, self._policy, size, replica_num, now, tenant, trusted, suspects=False)
        if room.placed or room.retry_after_s:
            return room
        # Only suspected daemons are left: one with room takes the block; else room is made there,
        # no more than this block needs (a suspicion never costs the store more).
        placed = segments.place(size, replica_num, Tier.DRAM, now)
        if placed:
            return Room(placed)
        return make_room(self._st, self._policy, size, replica_num, now, tenant, frozenset(droppable), suspects=True)
