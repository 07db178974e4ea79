"""The client side of the `nixl` transport (see nixl_agent.py for the trust boundary)."""

from __future__ import annotations

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
from kvstore.transport import nixl_agent, nixl_staging
from kvstore.transport.base import Transfer, Transport, Written, checked_view
from kvstore.transport.nixl_agent import Peer, descs, parse_address, run_transfer, start_agent
from kvstore.transport.nixl_staging import Buffer, Staging
from kvstore.types import GrantMode, SegmentInfo

_DEAD_FOR_S = 2.0  # a daemon agent that failed a transfer is not tried for this long
_OPS = {GrantMode.WRITE: "WRITE", GrantMode.READ: "READ"}


class _Agent:
    """The client side's agent, one per process (each holds a UCX context and a progress
    thread), started on first use with the first client's backends; and what it loaded of each
    daemon agent: per segment, that segment's partial metadata. A daemon agent that failed a
    transfer is unloaded (its connection is dropped) and not tried for _DEAD_FOR_S; a restarted
    daemon comes under a new agent name, so nothing of the dead one is ever used for it."""

    _lock = threading.Lock()
    _agent: Any = None
    _loaded: ClassVar[dict[str, set[int]]] = {}  # daemon agent -> segment bases whose metadata is loaded
    _dead: ClassVar[dict[str, float]] = {}  # daemon agent -> monotonic time to try it again at

    @classmethod
    def get(cls, config: ClientConfig) -> Any:
        with cls._lock:
            if cls._agent is None:
                backends = getattr(config, "nixl_backends", nixl_agent.DEFAULT_BACKENDS)
                cls._agent = start_agent("client", backends, config.ucx_tls, progress_thread=False)
            return cls._agent

    @classmethod
    def reach(cls, agent: Any, peer: Peer, segment_id: str) -> None:
        """Load `peer`'s metadata for this segment unless loaded; TransportError for a daemon
        agent that failed a moment ago."""
        with cls._lock:
            retry_at = cls._dead.get(peer.agent)
            if retry_at is not None:
                if time.monotonic() < retry_at:
                    raise TransportError(
                        f"the daemon of segment {segment_id} (nixl agent {peer.agent}) failed a "
                        "transfer a moment ago; it may have stopped"
                    )
                del cls._dead[peer.agent]
            bases = cls._loaded.setdefault(peer.agent, set())
            if peer.base in bases:
                return
            try:
                loaded = agent.add_remote_agent(peer.metadata)
            except Exception as exc:  # NIXL's own error types
                raise nixl_agent.wrap(f"loading the metadata of segment {segment_id}", exc) from exc
            if loaded.decode() != peer.agent:
                raise TransportError(f"nixl: segment {segment_id}'s metadata names agent {loaded!r}, not {peer.agent}")
            bases.add(peer.base)

    @classmethod
    def failed(cls, agent: Any, peer: str) -> None:
        with cls._lock:
            cls._dead[peer] = time.monotonic() + _DEAD_FOR_S
            if cls._loaded.pop(peer, None) is not None:
                try:
                    agent.remove_remote_agent(peer)
                except Exception:  # noqa: BLE001 - already gone is what we wanted
                    pass


@dataclass(frozen=True)
class _Piece:
    """Part of one transfer that fits a staging buffer."""

    transfer: int  # index of its Transfer
    local: memoryview  # the caller's bytes
    remote: int  # address in the daemon's segment


class NixlTransport(Transport):
    """Moves bytes through registered staging memory (nixl_staging.py), one NIXL transfer per 64 MiB
    round with a descriptor per block piece; the copy in or out of staging computes each block's
    checksum, so the client does not read the bytes again."""

    name = "nixl"

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        self._lock = threading.Lock()
        self._staging: Staging | None = None

    @property
    def staging(self) -> Staging | None:
        """The staging memory this transport moves bytes through (None before its first call)."""
        with self._lock:
            return self._staging

    def can_reach(self, segment: SegmentInfo) -> bool:
        return self.address_of(segment, parse_address) is not None

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        return Written(self._move(segment, transfers, GrantMode.WRITE, deadline), None)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.READ, deadline)

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode, deadline: float) -> list[int]:
        peer = self.address_of(segment, parse_address)
        if peer is None:
            raise TransportError(f"segment {segment.segment_id} offers no nixl endpoint")
        now = self.now_ms()
        views = [checked_view(segment, t, mode, self.name, now) for t in transfers]
        if not views:
            return []
        agent = _Agent.get(self.config)
        _Agent.reach(agent, peer, segment.segment_id)
        staging = self._staging_of(agent)
        pieces = deque(
            _Piece(i, view[k : k + nixl_staging.STAGING_BYTES], peer.base + t.grant.offset + k)
            for i, (t, view) in enumerate(zip(transfers, views))
            for k in range(0, view.nbytes, nixl_staging.STAGING_BYTES)
        )
        hashes = [hasher() for _ in transfers]
        buf = staging.take()
        settled = True
        try:
            while pieces:
                round_, used = [], 0
                while pieces and used + pieces[0].local.nbytes <= nixl_staging.STAGING_BYTES:
                    round_.append((pieces.popleft(), used))
                    used += round_[-1][0].local.nbytes
                self._round(agent, peer.agent, mode, round_, buf, hashes, segment, deadline)
        except _Unsettled:
            settled = False
            raise
        finally:
            staging.give_back(buf, settled)
        return [h.intdigest() for h in hashes]

    def _round(
        self,
        agent: Any,
        peer: str,
        mode: GrantMode,
        round_: list[tuple[_Piece, int]],
        buf: Buffer,
        hashes: list[xxhash.xxh3_64],
        segment: SegmentInfo,
        deadline: float,
    ) -> None:
        """Move one staging buffer's worth: copy in (write), one transfer, copy out (read)."""
        stage = memoryview(buf.array.data)
        if mode is GrantMode.WRITE:
            for piece, at in round_:
                copy_hashing(stage[at : at + piece.local.nbytes], piece.local, hashes[piece.transfer])
        sizes = [piece.local.nbytes for piece, _ in round_]
        local = np.array([(buf.address + at, n, 0) for (_, at), n in zip(round_, sizes)], dtype=np.uint64)
        remote = np.array([(piece.remote, n, 0) for (piece, _), n in zip(round_, sizes)], dtype=np.uint64)
        outcome = run_transfer(agent, _OPS[mode], descs(agent, local), descs(agent, remote), peer, deadline)
        if not outcome.done:
            what = f"nixl {mode.name.lower()} of {len(round_)} pieces in segment {segment.segment_id} failed"
            if outcome.refused:  # nothing was posted: the daemon is not to blame
                raise TransportError(f"{what}: {outcome.why}")
            _Agent.failed(agent, peer)
            error = _Unsettled if not outcome.settled else TransportError
            raise error(f"{what}: {outcome.why}")
        if mode is GrantMode.READ:
            for piece, at in round_:
                copy_hashing(piece.local, stage[at : at + piece.local.nbytes], hashes[piece.transfer])

    def _staging_of(self, agent: Any) -> Staging:
        with self._lock:
            if self._staging is None:
                self._staging = Staging(agent)
            return self._staging

    def forget(self, segment_id: str) -> None:
        """Nothing per segment: a daemon that went away is unloaded when a transfer to it fails,
        and a restarted one comes under a new agent name."""

    def close(self) -> None:
        """Release idle staging memory; the process-wide agent stays for other clients."""
        staging = self.staging
        if staging is not None:
            staging.release()


class _Unsettled(TransportError):
    """A transfer failed and NIXL could not cancel it: its staging buffer may still be touched."""
