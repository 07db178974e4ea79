"""The daemon's mover: claims move tasks from the metadata service, copies the bytes into its own
segments (between two of them to demote or promote; from another daemon's replica, under a read
grant, to replace a lost replica), journals what landed on a persistent segment, and reports
back. The service switches replicas only after the report. FORGET tasks move nothing: they name
blocks of a persistent segment the service no longer holds, whose deletion is journaled.

Journaling and the report happen under `journal_lock`, which the daemon's re-announcement of a
persistent segment (recover, then announce) holds too: what the service is told a segment holds
is never older than what it last heard of the segment from this mover."""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from kvstore.checksum import checksum
from kvstore.errors import KVStoreError, TransportError, Unavailable
from kvstore.metaclient.client import MetaClient
from kvstore.results import Block, MoveOutcome
from kvstore.storage.base import Persistent, SegmentStorage, copy_between
from kvstore.transport import registry
from kvstore.transport.base import Transfer, Transport
from kvstore.types import MoveKind, MoveTask, SegmentInfo
from kvstore.wire.calls import ClaimMoves, CompleteMoves

log = logging.getLogger(__name__)
_FETCH_TIMEOUT_S = 10.0
_FLUSH_TIMEOUT_S = 2.0  # at stop: how long the last claim (deletions only) may take


class TierMover:
    def __init__(
        self,
        daemon_id: str,
        meta: MetaClient,
        segments: Callable[[str], SegmentStorage | None],
        poll_s: float,
        batch_bytes: int,
        journal_lock: threading.Lock | None = None,
    ) -> None:
        self._daemon_id = daemon_id
        self._meta = meta
        self._segments = segments
        self._poll_s = poll_s
        self._batch_bytes = batch_bytes
        self._journal_lock = journal_lock or threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="daemon-mover", daemon=True)
        self._transports: dict[str, Transport] = {}  # client sides, for copies from other daemons
        self.moved = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming, and journal the deletions the service has for this daemon's persistent
        segments now (best effort: a service that does not answer keeps them, and refuses those
        blocks when they are announced again)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        try:
            tasks = self._meta.call(ClaimMoves(self._daemon_id, 0), timeout_s=_FLUSH_TIMEOUT_S)
            self._run(tasks, _FLUSH_TIMEOUT_S)
        except KVStoreError as exc:
            log.warning("deletions for the SSD journal not taken at stop: %s", exc)
        for transport in self._transports.values():
            transport.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once()
            except KVStoreError as exc:
                log.warning("tier moves: metadata service unreachable (%s)", exc)
                busy = False
            if not busy:
                self._stop.wait(self._poll_s)

    def run_once(self) -> bool:
        """Claim, copy and report one batch; True if there was work."""
        tasks = self._meta.call(ClaimMoves(self._daemon_id, self._batch_bytes))
        if not tasks:
            return False
        self._run(tasks)
        return True

    def _run(self, tasks: Sequence[MoveTask], timeout_s: float | None = None) -> None:
        forgets = [t for t in tasks if t.kind is MoveKind.FORGET]
        moves = [t for t in tasks if t.kind is not MoveKind.FORGET]
        results = [self._copy(t) for t in moves]
        with self._journal_lock:
            # Deletions first: the service handed them out before any move in this batch was made.
            outcomes = self._forget(forgets)
            self._journal([t for t, (ok, _) in zip(moves, results) if ok])
            outcomes += [MoveOutcome(t.move_id, ok, err) for t, (ok, err) in zip(moves, results)]
            if outcomes:
                self._meta.call(CompleteMoves(self._daemon_id, outcomes), timeout_s=timeout_s)
        self.moved += sum(ok for ok, _ in results)

    def _copy(self, task: MoveTask) -> tuple[bool, str]:
        dst = self._segments(task.dst_segment_id)
        if task.kind is MoveKind.REPLICATE:
            return self._fetch(task, dst)
        src = self._segments(task.src_segment_id)
        if src is None or dst is None:
            return False, "segment not served by this daemon"
        try:
            copy_between(src, task.src_offset, dst, task.dst_offset, task.size)
            return True, ""
        except (OSError, ValueError) as exc:
            log.warning("move %d of %r failed: %s", task.move_id, task.key, exc)
            return False, str(exc)

    def _fetch(self, task: MoveTask, dst: SegmentStorage | None) -> tuple[bool, str]:
        """Read another daemon's replica into `dst`, and check it against the key's checksum."""
        if dst is None or task.source is None or task.source_segment is None:
            return False, "a copy task without its source, or for a segment not served here"
        view = dst.view(task.dst_offset, task.size)
        target = view if view is not None else memoryview(bytearray(task.size))
        try:
            transport = self._reader_for(task.source_segment)
            transport.read(task.source_segment, [Transfer(task.source, target)], time.monotonic() + _FETCH_TIMEOUT_S)
            if checksum(target) != task.checksum:
                return False, "the copy does not match the key's checksum"
            if view is None:
                dst.write_from(task.dst_offset, target)
        except (KVStoreError, OSError, ValueError) as exc:
            log.warning("copy of %r from %s failed: %s", task.key, task.source_segment.daemon_id, exc)
            return False, str(exc)
        return True, ""

    def _reader_for(self, segment: SegmentInfo) -> Transport:
        for name in ("shm", "tcp", "ucx"):
            if segment.endpoint(name) is None:
                continue
            transport = self._transports.get(name)
            if transport is None:
                try:
                    transport = self._transports[name] = registry.client_class(name)()
                except Unavailable:
                    continue
            if transport.can_reach(segment):
                return transport
        raise TransportError(f"no transport of this daemon reaches segment {segment.segment_id}")

    def _forget(self, tasks: list[MoveTask]) -> list[MoveOutcome]:
        """Journal FORGET tasks' deletions, one append per segment. A segment this daemon does not
        serve, or that keeps no journal, has nothing to forget; a journal that fails is reported,
        and the service hands the task out again."""
        by_segment: dict[str, list[MoveTask]] = defaultdict(list)
        for t in tasks:
            by_segment[t.dst_segment_id].append(t)
        outcomes = []
        for segment_id, forgets in by_segment.items():
            seg = self._segments(segment_id)
            ok, error = True, ""
            if seg is not None and isinstance(seg, Persistent):
                try:
                    seg.forget_many([Block(t.key, t.dst_offset, t.size, t.checksum) for t in forgets])
                except OSError as exc:
                    log.warning("journal of deletions in %s failed: %s", segment_id, exc)
                    ok, error = False, f"journal failed: {exc}"
            outcomes += [MoveOutcome(t.move_id, ok, error) for t in forgets]
        return outcomes

    def _journal(self, done: list[MoveTask]) -> None:
        """Record blocks that landed on persistent segments, so a restart can re-announce them."""
        by_segment: dict[str, list[Block]] = defaultdict(list)
        persistent: dict[str, Persistent] = {}
        for t in done:
            seg = self._segments(t.dst_segment_id)
            if seg is not None and isinstance(seg, Persistent):
                persistent[t.dst_segment_id] = seg
                by_segment[t.dst_segment_id].append(Block(t.key, t.dst_offset, t.size, t.checksum))
        for segment_id, records in by_segment.items():
            try:
                persistent[segment_id].record_many(records)
            except OSError as exc:  # the bytes are there; only recovery after a restart loses them
                log.warning("journal of %s failed: %s", segment_id, exc)
