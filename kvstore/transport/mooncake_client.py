"""The client side of the `mooncake` transport (see mooncake_engine.py for the trust boundary)."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import xxhash

from kvstore.checksum import copy_hashing, hasher
from kvstore.clock import Clock
from kvstore.config import ClientConfig
from kvstore.errors import TransportError
from kvstore.transport import mooncake_staging
from kvstore.transport.base import Transfer, Transport, Written, checked_view
from kvstore.transport.mooncake_engine import (
    PeerGone,
    TransferEngine,
    listening,
    local_host_towards,
    parse_address,
    start_engine,
)
from kvstore.types import GrantMode, SegmentInfo

_MAX_ENTRIES = 4096  # transfers per engine call
# Blocks go to the engine in pieces of at most this: it moves a batch's entries in parallel, and
# measured here (tcp) 1 MiB moved as 2 x 512 KiB at 3.5 GB/s, as one entry at 1.1 GB/s.
_ENTRY = 512 << 10
_DEAD_FOR_S = 2.0  # a daemon found gone after a failed call is not tried for this long
# Every sync call busy-polls a core until it completes, and more concurrent calls do not move more
# bytes; past this many, calls wait their turn (bounded by their deadline).
_CALLS = threading.BoundedSemaphore(max(1, min(4, (os.cpu_count() or 2) // 2)))


class _Engines:
    """The client side's engine, one per process (each engine holds two ports and a thread pool),
    started on first use with the protocol of the first endpoint reached.

    The engine keeps what it learnt of each peer for good, under host:port names that a new
    engine on that host may come back under (mooncake_engine says how). So a peer is reached
    through an engine that holds nothing stale about its names: the engine is replaced by a new
    one (the old one goes once the calls and transports still holding it let go) before it
    reaches

    - a session name it reached as another incarnation (its descriptor, so its data port, would
      be the dead engine's), or
    - a new incarnation on a host where it found a peer gone (the dead peer's data port, to which
      it may still hold connections, may be the new one's).

    An incarnation older than one seen under its session name has stopped (mooncake_engine.
    new_incarnation): it is refused, not sent to the newer one's engine."""

    _lock = threading.Lock()
    _engine: TransferEngine | None = None
    _protocol = ""
    _reached: ClassVar[dict[str, str]] = {}  # session -> incarnation, of the current engine
    _gone_on: ClassVar[set[str]] = set()  # hosts where the current engine found a peer gone
    _latest: ClassVar[dict[str, str]] = {}  # session -> the newest incarnation seen under it

    @classmethod
    def get(cls, protocol: str, device: str, session: str, incarnation: str) -> TransferEngine:
        with cls._lock:
            if cls._engine is not None and protocol != cls._protocol:
                raise TransportError(f"this process's Mooncake engine speaks {cls._protocol}, the segment {protocol}")
            if incarnation < cls._latest.get(session, incarnation):
                raise PeerGone(f"the daemon engine once at {session} has stopped: a newer one is there")
            cls._latest[session] = incarnation
            reached = cls._reached.get(session)
            if (
                cls._engine is not None
                and reached != incarnation
                and (reached is not None or _host(session) in cls._gone_on)
            ):
                cls._engine = None
            if cls._engine is None:
                cls._engine = start_engine(local_host_towards(session), protocol, device)
                cls._protocol, cls._reached, cls._gone_on = protocol, {}, set()
            cls._reached[session] = incarnation
            return cls._engine

    @classmethod
    def gone(cls, engine: TransferEngine, session: str) -> None:
        """`engine` found nothing listening at `session` any more."""
        with cls._lock:
            if engine is cls._engine:
                cls._gone_on.add(_host(session))

    @classmethod
    def speaks(cls, protocol: str) -> bool:
        return cls._engine is None or cls._protocol == protocol


def _host(session: str) -> str:
    return session.rpartition(":")[0]


@dataclass(frozen=True)
class _Piece:
    """Part of one transfer that fits a staging round."""

    transfer: int  # index of its Transfer
    local: memoryview  # the caller's bytes
    remote: int  # address in the daemon's segment


class MooncakeTransport(Transport):
    """Moves bytes through registered staging memory (see mooncake_staging), in rounds of at most 64 MiB,
    each one engine batch call (entries chunked at 4096); the copy in or out of staging computes
    each block's checksum, so the client does not read the bytes again."""

    name = "mooncake"

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._device = self.config.mooncake_device
        self._dead: dict[tuple[str, str], float] = {}  # (session, incarnation) -> monotonic time to retry at
        self._lock = threading.Lock()
        self._engine: TransferEngine | None = None
        self._staging: mooncake_staging.Staging | None = None

    @property
    def staging(self) -> mooncake_staging.Staging | None:
        """The staging memory this transport moves bytes through (None before its first call);
        its `abandoned` buffers are those a failed call left to the engine."""
        with self._lock:
            return self._staging

    def can_reach(self, segment: SegmentInfo) -> bool:
        fields = self.address_of(segment, parse_address)
        return fields is not None and _Engines.speaks(fields[0])

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        return Written(self._move(segment, transfers, GrantMode.WRITE, deadline), None)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.READ, deadline)

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode, deadline: float) -> list[int]:
        ep = segment.endpoint(self.name)
        if ep is None:
            raise TransportError(f"segment {segment.segment_id} offers no mooncake endpoint")
        protocol, session, base, incarnation = parse_address(ep.address)
        now = self.now_ms()
        views = [checked_view(segment, t, mode, self.name, now) for t in transfers]
        with self._lock:
            retry_at = self._dead.get((session, incarnation))
        if retry_at is not None and time.monotonic() < retry_at:
            raise TransportError(
                f"the daemon of segment {segment.segment_id} ({session}) did not answer "
                "a moment ago; it may have stopped"
            )
        engine, staging = self._engine_for(protocol, session, incarnation)
        pieces = deque(
            _Piece(i, view[k : k + mooncake_staging.STAGING_BYTES], base + t.grant.offset + k)
            for i, (t, view) in enumerate(zip(transfers, views))
            for k in range(0, view.nbytes, mooncake_staging.STAGING_BYTES)
        )
        hashes = [hasher() for _ in transfers]
        buf = staging.take(engine)
        clean = False
        try:
            while pieces:
                round_, used = [], 0
                while pieces and used + pieces[0].local.nbytes <= mooncake_staging.STAGING_BYTES:
                    round_.append((pieces.popleft(), used))
                    used += round_[-1][0].local.nbytes
                self._round(engine, (session, incarnation), mode, round_, buf, hashes, segment, deadline)
            clean = True
        except PeerGone:
            clean = True  # a dead daemon sends nothing more: the buffer is safe
            raise
        finally:
            staging.give_back(buf, clean)
        return [h.intdigest() for h in hashes]

    def _round(
        self,
        engine: TransferEngine,
        peer: tuple[str, str],
        mode: GrantMode,
        round_: list[tuple[_Piece, int]],
        buf: np.ndarray[Any, np.dtype[np.uint8]],
        hashes: list[xxhash.xxh3_64],
        segment: SegmentInfo,
        deadline: float,
    ) -> None:
        """Move one staging buffer's worth: copy in (write), engine calls, copy out (read)."""
        stage, base = memoryview(buf.data), buf.ctypes.data
        if mode is GrantMode.WRITE:
            for piece, at in round_:
                copy_hashing(stage[at : at + piece.local.nbytes], piece.local, hashes[piece.transfer])
        entries = [
            (base + at + k, piece.remote + k, min(_ENTRY, piece.local.nbytes - k))
            for piece, at in round_
            for k in range(0, piece.local.nbytes, _ENTRY)
        ]
        for start in range(0, len(entries), _MAX_ENTRIES):
            local, remote, lengths = zip(*entries[start : start + _MAX_ENTRIES])
            self._call(engine, peer, mode, list(local), list(remote), list(lengths), segment, deadline)
        if mode is GrantMode.READ:
            for piece, at in round_:
                copy_hashing(piece.local, stage[at : at + piece.local.nbytes], hashes[piece.transfer])

    def _engine_for(
        self, protocol: str, session: str, incarnation: str
    ) -> tuple[TransferEngine, mooncake_staging.Staging]:
        """The engine to reach this incarnation through (see _Engines), and staging of that engine."""
        engine = _Engines.get(protocol, self._device, session, incarnation)
        with self._lock:
            old_engine, old_staging = self._engine, self._staging
            if engine is not old_engine:
                abandoned = old_staging.abandoned if old_staging is not None else None
                self._engine = engine
                self._staging = mooncake_staging.Staging(register=protocol != "tcp", abandoned=abandoned)
            staging = self._staging
            assert staging is not None
        if engine is not old_engine and old_staging is not None:
            old_staging.retire(old_engine)
        return engine, staging

    def _call(
        self,
        engine: TransferEngine,
        peer: tuple[str, str],
        mode: GrantMode,
        local: list[int],
        remote: list[int],
        lengths: list[int],
        segment: SegmentInfo,
        deadline: float,
    ) -> None:
        """One batch call, or TransportError; a daemon whose RPC port then refuses (or does not
        answer) is not tried again for _DEAD_FOR_S, so calls to a dead daemon fail at once."""
        if not local:
            return
        session = peer[0]
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not _CALLS.acquire(timeout=remaining):
            raise TransportError(f"mooncake {mode.name.lower()} of segment {segment.segment_id}: the deadline passed")
        try:
            if mode is GrantMode.WRITE:
                rc = engine.batch_transfer_sync_write(session, local, remote, lengths)
            else:
                rc = engine.batch_transfer_sync_read(session, local, remote, lengths)
        finally:
            _CALLS.release()
        if rc == 0:
            return
        alive = listening(session)
        if not alive:
            with self._lock:
                self._dead[peer] = time.monotonic() + _DEAD_FOR_S
        if alive is None:
            raise TransportError(
                f"mooncake {mode.name.lower()} of {len(local)} pieces in segment "
                f"{segment.segment_id} failed: {session} does not answer"
            )
        if alive is False:
            _Engines.gone(engine, session)
            raise PeerGone(
                f"mooncake {mode.name.lower()} of {len(local)} pieces in segment "
                f"{segment.segment_id} failed: nothing listens at {session} any more; "
                "its daemon has stopped"
            )
        raise TransportError(
            f"mooncake {mode.name.lower()} of {len(local)} pieces in segment "
            f"{segment.segment_id} at {session} failed (rc {rc}): the daemon is hung "
            "or overloaded, or refused the range (segment unmounted?)"
        )

    def forget(self, segment_id: str) -> None:
        """Nothing per segment: the engine caches sessions itself, and _Engines keeps a restarted
        daemon (a new incarnation) from being reached through a dead one's cached state."""

    def close(self) -> None:
        """Release idle staging memory; the process-wide engine stays for other clients."""
        with self._lock:
            if self._staging is not None:
                self._staging.release(self._engine)
