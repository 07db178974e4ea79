"""Space reserved in advance for small same-host puts (the service's side: kvstore/meta/regions.py).

The client takes a region of one DRAM segment on its own host (Reserve), cuts a piece off it for
each small value, writes the value over shm, and makes it visible with one PutCommit: a put is
one metadata call instead of two. A region is used until it is full or about to expire; it is
handed back (its uncommitted space freed) with a later commit once no write into it is still
in flight. Regions grow, doubling from REGION_MIN up to `region_bytes`, so a client that puts a
few values holds little. Where the service offers none (another host, a GPU tier first, an
older service, no room now) the writer uses PutStart, and asks again only after a pause.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvstore.clock import Clock, now_ms
from kvstore.errors import ErrorCode, KVStoreError
from kvstore.metaclient.client import MetaClient
from kvstore.types import Grant, SegmentInfo
from kvstore.wire.calls import PutCommit, Reserve

REGION_MIN = 256 << 10
EXPIRY_MARGIN_S = 1.0  # no piece is cut from a region this close to its grant's expiry
# After a refusal, how long the writer uses PutStart (which makes room, or follows a new leader).
PAUSE_S = {ErrorCode.NO_SPACE: 1.0, ErrorCode.UNAVAILABLE: 1.0, ErrorCode.NOT_LEADER: 1.0}
PAUSE_DEFAULT_S = 30.0


@dataclass
class Region:
    region_id: int
    grant: Grant  # LOCAL, WRITE, over the whole region
    segment: SegmentInfo
    alignment: int
    until: float  # time.monotonic() when pieces stop being cut
    cursor: int = 0  # the next piece's offset in the segment
    inflight: int = 0  # pieces taken and not yet committed (or given up)
    retired: bool = False  # full or expiring: released once nothing is in flight

    @property
    def end(self) -> int:
        return self.grant.offset + self.grant.length


class Piece(NamedTuple):
    region: Region
    offset: int  # in the segment: the value goes to [offset, +its size), inside the region's grant


@dataclass
class RegionPool:
    """Thread safe."""

    meta: MetaClient
    client_id: str
    host: str
    region_bytes: int
    max_value: int
    clock: Clock
    _current: Region | None = None
    _size: int = REGION_MIN
    _paused_until: float = 0.0
    _release: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, size: int) -> Piece | None:
        """A piece for a `size`-byte value, or None: put it with PutStart."""
        return self.take_many([size])[0]

    def take_many(self, sizes: Sequence[int]) -> list[Piece | None]:
        """A piece for each value of `sizes` bytes, in order, or None for one to put with PutStart
        (too large, or once no region is offered: then for the rest of the batch too)."""
        pieces: list[Piece | None] = [None] * len(sizes)
        if not self.host:
            return pieces
        with self._lock:
            now = time.monotonic()
            if now < self._paused_until:
                return pieces
            region = self._current
            end = region.end if region else 0
            for i, size in enumerate(sizes):
                if size > self.max_value or size <= 0:
                    continue
                need = -(-size // region.alignment) * region.alignment if region else size
                if region is None or region.cursor + need > end or now >= region.until:
                    region = self._reserve(max(size, self._size), now)
                    if region is None:
                        return pieces
                    end = region.end
                    need = -(-size // region.alignment) * region.alignment
                pieces[i] = Piece(region, region.cursor)
                region.cursor += need
                region.inflight += 1
        return pieces

    def _reserve(self, size: int, now: float) -> Region | None:
        """A new region (the current one is retired); None, and a pause, if none is offered."""
        if self._current is not None:
            self._retire(self._current)
            self._current = None
        try:
            reply = self.meta.call(Reserve(self.client_id, self.host, size))
        except KVStoreError as exc:  # e.g. an older service without regions, or none answering now
            # From the failure, not from before the call: a call to no service outlasts the pause,
            # and every value of the batch would ask again.
            self._paused_until = time.monotonic() + PAUSE_S.get(exc.code, PAUSE_DEFAULT_S)
            return None
        if reply.code is not ErrorCode.OK or reply.grant is None or reply.segment is None:
            self._paused_until = time.monotonic() + PAUSE_S.get(reply.code, PAUSE_DEFAULT_S)
            return None
        left_s = (reply.grant.expires_ms - now_ms(self.clock)) / 1000 - EXPIRY_MARGIN_S
        self._size = min(self.region_bytes, self._size * 2)
        self._current = Region(
            reply.region_id, reply.grant, reply.segment, reply.alignment, now + max(0.0, left_s), reply.grant.offset
        )
        return self._current

    def _retire(self, region: Region) -> None:
        region.retired = True
        if region.inflight == 0:
            self._release.append(region.region_id)

    def done(self, pieces: list[Piece]) -> None:
        """These pieces are committed (or given up): nothing writes into them any more."""
        with self._lock:
            for piece in pieces:
                region = piece.region
                region.inflight -= 1
                if region.retired and region.inflight == 0:
                    self._release.append(region.region_id)

    def close(self) -> None:
        """Hand every region back now, its uncommitted space freed at once rather than when its
        grant runs out (no put may be in flight)."""
        with self._lock:
            if self._current is not None:
                self._retire(self._current)
                self._current = None
            ids, self._release = self._release, []
        if ids:
            try:
                self.meta.call(PutCommit(self.client_id, 0, [], [], [], [], ids))  # a commit of nothing releases them
            except KVStoreError:
                pass  # they go back when their grants run out

    def take_released(self) -> list[int]:
        """Regions to hand back with the next commit."""
        with self._lock:
            ids, self._release = self._release, []
        return ids
