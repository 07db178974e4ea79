"""A storage daemon's link to one metadata shard: the segments it offers that shard, their
mounting, the heartbeat that keeps them, and the mover that runs that shard's tier moves and
copies. A daemon of an unsharded store has one link; of a store of S shards, S (one slice of
every tier per shard, so each shard can place replicas on every daemon)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvstore.daemon.mover import TierMover
from kvstore.errors import KVStoreError, Unavailable
from kvstore.metaclient.client import MetaClient
from kvstore.results import Block
from kvstore.storage.base import Persistent, SegmentStorage
from kvstore.types import SegmentInfo
from kvstore.wire.calls import AnnounceBlocks, Heartbeat, MountSegment, UnmountSegment

log = logging.getLogger(__name__)
_ANNOUNCE_BATCH = 1000


class ShardLink:
    def __init__(
        self,
        shard: int,
        daemon_id: str,
        meta: MetaClient,
        info: Callable[[SegmentStorage], SegmentInfo],
        interval_s: float,
    ) -> None:
        self.shard = shard
        self.meta = meta
        self.segments: dict[str, SegmentStorage] = {}
        self.recovered: dict[str, list[Block]] = {}
        self._daemon_id = daemon_id
        self._info = info
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-s{shard}", daemon=True)
        self._mover: TierMover | None = None
        # Held by the mover while it journals and reports, and here while a persistent segment is
        # recovered and announced again: see kvstore/daemon/mover.py.
        self._journal_lock = threading.Lock()

    def mount_all(self, deadline: float) -> None:
        """Offer every segment (retrying until `deadline` while the service does not answer) and
        announce what persistent segments recovered."""
        for seg in self.segments.values():
            self._mount(seg, deadline)
        for segment_id, blocks in self.recovered.items():
            self._announce(segment_id, blocks)
        self.recovered.clear()

    def start(self, segment: Callable[[str], SegmentStorage | None], poll_s: float, batch_bytes: int) -> None:
        """Heartbeats and the mover, until stop()."""
        self._heartbeat.start()
        self._mover = TierMover(self._daemon_id, self.meta, segment, poll_s, batch_bytes, self._journal_lock)
        self._mover.start()

    def stop(self) -> None:
        """Stop the threads (the mover journals the deletions still waiting for it) and withdraw
        the segments (best effort: a service that does not answer gives them up when their
        heartbeats stop)."""
        self._stop.set()
        if self._mover is not None:
            self._mover.stop()
        if self._heartbeat.is_alive():
            self._heartbeat.join(timeout=5)
        for segment_id in self.segments:
            try:
                self.meta.call(UnmountSegment(segment_id), timeout_s=2)
            except KVStoreError as exc:
                log.warning("could not unmount %s: %s", segment_id, exc)

    def _announce(self, segment_id: str, blocks: list[Block]) -> None:
        for start in range(0, len(blocks), _ANNOUNCE_BATCH):
            self.meta.call(AnnounceBlocks(segment_id, blocks[start : start + _ANNOUNCE_BATCH]))

    def _mount(self, seg: SegmentStorage, deadline: float) -> None:
        try:
            self.meta.call(MountSegment(self._info(seg)), retry_s=max(0.0, deadline - time.monotonic()))
        except Unavailable as exc:
            raise Unavailable(f"mounting segment {seg.segment_id} at {self.meta.address}: {exc}") from exc

    def _heartbeat_loop(self) -> None:
        interval = self._interval_s
        while not self._stop.wait(interval):
            try:
                reply = self.meta.call(Heartbeat(self._daemon_id, list(self.segments)), timeout_s=max(1.0, interval))
                for segment_id in reply.unknown_segment_ids:
                    # The service restarted or gave us up for dead: offer the segment afresh, and
                    # what a persistent segment still holds.
                    log.warning("metadata service does not know segment %s: mounting it again", segment_id)
                    seg = self.segments[segment_id]
                    self._mount(seg, time.monotonic() + interval)
                    if isinstance(seg, Persistent):
                        with self._journal_lock:
                            self._announce(segment_id, seg.recover().blocks)
            except KVStoreError as exc:
                log.warning("heartbeat to %s failed: %s", self.meta.address, exc)
