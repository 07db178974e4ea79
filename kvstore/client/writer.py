"""The client's put: PutStart, the bytes straight into each replica's daemon, PutEnd; or, for a
small value put over shm, a piece of a region reserved in advance (regions.py), the bytes, and
one PutCommit.

A replica whose write fails does not fail its key: the replicas that were written are committed
(the key is then under-replicated, and the service copies it again later), the failed daemon is
reported so placement avoids it, and a key none of whose replicas could be written is revoked
and put once more (elsewhere) while time is left. Each replica's write of a key that has others
is bounded by a deadline scaled to its bytes, so a stopped daemon costs one such deadline. The
daemons of one put are written at once, so one that does not answer holds up none of the others.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvstore.checksum import checksum
from kvstore.client.regions import Piece, RegionPool
from kvstore.client.transports import Transports
from kvstore.config import ClientConfig
from kvstore.errors import ErrorCode, KVStoreError, TransportError, Unavailable
from kvstore.metaclient.sharded import ShardedMetaClient
from kvstore.results import KeyResult, PutStartResult, PutWritten
from kvstore.transport.base import Transfer, Written
from kvstore.types import Grant, SegmentInfo
from kvstore.wire.calls import PutCommit, PutEnd, PutRevoke, PutStart

log = logging.getLogger(__name__)
COMMIT_KEYS = 256
COMMITS_IN_FLIGHT = 2
MAX_WRITE_THREADS = 16  # daemons a put writes to at once


@dataclass
class _Key:
    """One key of a put attempt: its grants, and what became of each replica's write."""

    grants: list[Grant]
    errors: dict[int, KVStoreError] = field(default_factory=dict)  # replica -> why its write failed
    receipts: dict[int, bytes] = field(default_factory=dict)
    checksum: int | None = None


class Writer:
    def __init__(
        self, meta: ShardedMetaClient, transports: Transports, config: ClientConfig, regions: RegionPool | None = None
    ) -> None:
        self._meta = meta
        self._transports = transports
        self._config = config
        self._regions = regions
        self._pool_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_size = 0

    def put(self, keys: Sequence[str], views: Sequence[memoryview], replica_num: int) -> list[bool]:
        """Store each view under its key; True where written, False where already stored. The
        first error is raised after every other key is committed or revoked."""
        deadline = time.monotonic() + self._config.timeout_s
        written = [False] * len(keys)
        errors: dict[int, KVStoreError] = {}
        todo = list(range(len(keys)))
        # Regions are one service's: a sharded store's puts take PutStart (routed per key's shard).
        if self._regions is not None and replica_num == 1 and self._meta.shard_count == 1:
            todo = self._put_small(keys, views, todo, deadline, written, errors)
        for attempt in range(2):
            if not todo:
                break
            retry = self._attempt(keys, views, todo, replica_num, deadline, written, errors)
            if not retry or attempt or time.monotonic() >= deadline:
                break
            for i in retry:
                del errors[i]
            todo = retry
        if errors:
            raise errors[min(errors)]
        return written

    def _put_small(
        self,
        keys: Sequence[str],
        views: Sequence[memoryview],
        todo: list[int],
        deadline: float,
        written: list[bool],
        errors: dict[int, KVStoreError],
    ) -> list[int]:
        """Put what fits into pieces of regions: write each, commit them together. Returns the
        keys left for PutStart (no piece, a failed write, or a region the service no longer holds)."""
        assert self._regions is not None
        taken = self._regions.take_many([len(views[i]) for i in todo])
        pieces: dict[int, Piece] = {i: piece for i, piece in zip(todo, taken, strict=True) if piece is not None}
        if not pieces:
            return todo
        left = [i for i in todo if i not in pieces]
        by_region: dict[int, list[int]] = defaultdict(list)
        for i, piece in pieces.items():
            by_region[piece.region.region_id].append(i)
        # Commits of at most COMMIT_KEYS keys, COMMITS_IN_FLIGHT at a time: the service commits one
        # while this thread copies the next (each call is short for the service, too).
        runs = [idxs[n : n + COMMIT_KEYS] for idxs in by_region.values() for n in range(0, len(idxs), COMMIT_KEYS)]
        shm = self._transports.get("shm")
        inflight: deque[tuple[list[int], Callable[[], list[KeyResult]]]] = deque()
        failure: KVStoreError | None = None
        try:
            for idxs in runs:
                region = pieces[idxs[0]].region
                try:
                    done = shm.write_pieces(
                        region.segment, region.grant, [(pieces[i].offset, views[i]) for i in idxs], deadline
                    )
                except KVStoreError as exc:
                    log.warning(
                        "put: writing %d value(s) into a region failed (%s); putting them again", len(idxs), exc
                    )
                    left += idxs
                    continue
                sums = done.checksums or [checksum(views[i]) for i in idxs]
                commit = PutCommit(
                    self._regions.client_id, region.region_id, [keys[i] for i in idxs],
                    [pieces[i].offset for i in idxs], [len(views[i]) for i in idxs], sums,
                    self._regions.take_released(),
                )  # fmt: skip
                while len(inflight) >= COMMITS_IN_FLIGHT and failure is None:
                    failure = self._settle(*inflight.popleft(), written, left, errors)
                if failure is not None:
                    break
                try:
                    inflight.append((idxs, self._regions.meta.begin(commit)))
                except KVStoreError as exc:
                    failure = exc
                    break
        finally:
            while inflight:  # every answer read, so none is left on a connection; the first error is raised
                settled = self._settle(*inflight.popleft(), written, left, errors)
                failure = failure or settled
            self._regions.done(list(pieces.values()))
        if failure is not None:
            raise failure
        return sorted(left)

    @staticmethod
    def _settle(
        idxs: list[int],
        wait: Callable[[], list[KeyResult]],
        written: list[bool],
        left: list[int],
        errors: dict[int, KVStoreError],
    ) -> KVStoreError | None:
        """Take one PutCommit's answer for the keys `idxs`; the call's error, if it failed."""
        try:
            results = wait()
        except KVStoreError as exc:
            return exc
        for i, result in zip(idxs, results, strict=True):
            if result.code is ErrorCode.OK:
                written[i] = True
            elif result.code is ErrorCode.KEY_NOT_FOUND:  # the region is gone: put it again
                left.append(i)
            elif result.code is not ErrorCode.ALREADY_EXISTS:
                errors[i] = result.error() or KVStoreError(result.message)
        return None

    def _attempt(
        self,
        keys: Sequence[str],
        views: Sequence[memoryview],
        todo: list[int],
        replica_num: int,
        deadline: float,
        written: list[bool],
        errors: dict[int, KVStoreError],
    ) -> list[int]:
        """One round of PutStart, writes and PutEnd for keys `todo`; returns the keys worth
        another round (every replica's daemon failed)."""
        results, segments = self._put_start(keys, views, todo, replica_num, deadline)
        pending: dict[int, _Key] = {}
        for i, result in zip(todo, results, strict=True):
            if result.code is ErrorCode.OK:
                pending[i] = _Key(list(result.grants))
            elif result.code is not ErrorCode.ALREADY_EXISTS:
                errors[i] = result.error() or KVStoreError(result.message)
        failed_segments = self._write_all(views, pending, segments, deadline)
        ended: list[int] = []
        lost: list[int] = []
        for i, key in pending.items():
            (ended if len(key.errors) < len(key.grants) else lost).append(i)
        if lost:
            self._meta.call(PutRevoke([keys[i] for i in lost], sorted(failed_segments)))
            for i in lost:
                errors[i] = pending[i].errors[min(pending[i].errors)]
        if ended:
            self._end(keys, views, pending, ended, sorted(failed_segments), written, errors)
        return [i for i in lost if all(isinstance(e, TransportError) for e in pending[i].errors.values())]

    def _write_all(
        self, views: Sequence[memoryview], pending: dict[int, _Key], segments: dict[str, SegmentInfo], deadline: float
    ) -> set[str]:
        """Write every replica, a segment at a time within a daemon and the daemons at once (one that
        does not answer must not hold up the others: their grants would run out waiting); returns
        the segments whose writes failed because their daemon could not be reached."""
        by_segment: dict[str, list[tuple[int, int]]] = defaultdict(list)  # -> (key index, replica)
        for i, key in pending.items():
            for r, g in enumerate(key.grants):
                by_segment[g.segment_id].append((i, r))
        by_daemon: dict[str, list[str]] = defaultdict(list)
        for segment_id in by_segment:
            by_daemon[segments[segment_id].daemon_id].append(segment_id)

        def write_daemon(segment_ids: list[str]) -> list[tuple[str, Written | KVStoreError]]:
            out: list[tuple[str, Written | KVStoreError]] = []
            for segment_id in segment_ids:
                segment, items = segments[segment_id], by_segment[segment_id]
                transfers = [Transfer(pending[i].grants[r], views[i]) for i, r in items]
                try:
                    out.append((segment_id, self._transports.for_segment(segment).write(
                        segment, transfers, self._deadline(pending, items, views, deadline)
                    )))  # fmt: skip
                except KVStoreError as exc:
                    out.append((segment_id, exc))
            return out

        groups = list(by_daemon.values())
        if len(groups) == 1:
            outcomes = write_daemon(groups[0])
        else:
            outcomes = [o for done in self._pool(len(groups)).map(write_daemon, groups) for o in done]
        failed: set[str] = set()
        for segment_id, done in outcomes:
            items = by_segment[segment_id]
            if isinstance(done, KVStoreError):
                log.warning("put: writing %d block(s) to segment %s failed: %s", len(items), segment_id, done)
                if isinstance(done, TransportError):  # not the daemon's answer (say, an expired grant)
                    failed.add(segment_id)
                for i, r in items:
                    pending[i].errors[r] = done
                continue
            for n, (i, r) in enumerate(items):
                if done.receipts is not None:
                    pending[i].receipts[r] = done.receipts[n]
                if done.checksums is not None:  # computed while copying: no second pass
                    pending[i].checksum = done.checksums[n]
        return failed

    def _pool(self, daemons: int) -> ThreadPoolExecutor:
        """Threads for writing to several daemons at once (made on first need, kept)."""
        with self._pool_lock:
            if self._executor is None or self._executor_size < daemons:
                if self._executor is not None:
                    self._executor.shutdown(wait=False)
                self._executor_size = min(max(daemons, 4), MAX_WRITE_THREADS)
                self._executor = ThreadPoolExecutor(self._executor_size, thread_name_prefix="kvstore-put")
            return self._executor

    def close(self) -> None:
        with self._pool_lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _deadline(
        self, pending: dict[int, _Key], items: list[tuple[int, int]], views: Sequence[memoryview], deadline: float
    ) -> float:
        """A write to one segment gets the whole call's time if some key has no other replica,
        else a deadline scaled to its bytes (then the other replicas carry the key)."""
        if any(len(pending[i].grants) == 1 for i, _ in items):
            return deadline
        budget = self._config.transfer_budget_s(sum(len(views[i]) for i, _ in items))
        return min(deadline, time.monotonic() + budget)

    def _end(
        self,
        keys: Sequence[str],
        views: Sequence[memoryview],
        pending: dict[int, _Key],
        ended: list[int],
        failed_segments: list[str],
        written: list[bool],
        errors: dict[int, KVStoreError],
    ) -> None:
        sums, done = [], []
        for i in ended:
            key = pending[i]
            sums.append(key.checksum if key.checksum is not None else checksum(views[i]))
            mask = sum(1 << r for r in key.errors)
            done.append(PutWritten(mask, tuple(key.receipts.get(r, b"") for r in range(len(key.grants)))))
        reply = self._meta.call(PutEnd([keys[i] for i in ended], sums, done, failed_segments))
        for n, (i, result) in enumerate(zip(ended, reply.results, strict=True)):
            err = result.error()
            if err is not None:
                errors[i] = err
                continue
            written[i] = True
            committed = reply.replicas[n] if n < len(reply.replicas) else len(pending[i].grants)
            if committed < len(pending[i].grants):
                log.warning(
                    "put: %r committed with %d of %d replicas; the service copies it again once a daemon can take it",
                    keys[i],
                    committed,
                    len(pending[i].grants),
                )

    def _put_start(
        self,
        keys: Sequence[str],
        views: Sequence[memoryview],
        todo: list[int],
        replica_num: int,
        deadline: float,
    ) -> tuple[list[PutStartResult], dict[str, SegmentInfo]]:
        """PutStart, asking again for keys the service is making room for (retry_after_ms), until
        they are placed or the deadline passes."""
        results: dict[int, PutStartResult] = {}
        segments: dict[str, SegmentInfo] = {}
        ask = list(todo)
        while ask:
            try:
                reply = self._meta.call(
                    PutStart([keys[i] for i in ask], [len(views[i]) for i in ask], replica_num, self._transports.host)
                )
            except Unavailable as exc:
                if exc.retry_after_ms and time.monotonic() + exc.retry_after_ms / 1000 <= deadline:
                    time.sleep(exc.retry_after_ms / 1000)  # refused before anything was done: ask then
                    continue
                # The answer was lost: space may have been reserved. Revoke it (best effort; a put
                # never ended is revoked after its lease anyway) rather than ask twice.
                try:
                    self._meta.call(PutRevoke([keys[i] for i in ask]))
                except KVStoreError:
                    pass
                raise
            segments.update(reply.segments)
            retry, wait_ms = [], 0
            for i, result in zip(ask, reply.results, strict=True):
                results[i] = result
                if result.code is ErrorCode.NO_SPACE and result.retry_after_ms:
                    retry.append(i)
                    wait_ms = max(wait_ms, result.retry_after_ms)
            if not retry or time.monotonic() + wait_ms / 1000 > deadline:
                break
            time.sleep(wait_ms / 1000)  # the service said when room will be made: back off that long
            ask = retry
        return [results[i] for i in todo], segments
