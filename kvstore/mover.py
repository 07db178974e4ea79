"""The daemon's tier mover: claims move tasks from the metadata service, copies the bytes between
its own segments (DRAM -> SSD to demote, SSD -> DRAM to promote), journals what landed on a
persistent segment, and reports back. The service switches replicas only after the report."""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from typing import Callable

import grpc

from kvstore import wire
from kvstore.storage.base import SegmentStorage
from kvstore.types import MoveTask
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class TierMover:
    def __init__(self, daemon_id: str, stub: pb_grpc.MetaServiceStub,
                 segments: Callable[[str], SegmentStorage | None], poll_s: float, batch_bytes: int) -> None:
        self._daemon_id = daemon_id
        self._stub = stub
        self._segments = segments
        self._poll_s = poll_s
        self._batch_bytes = batch_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="daemon-mover", daemon=True)
        self.moved = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.run_once()
            except grpc.RpcError as exc:
                log.warning("tier moves: metadata service unreachable (%s)", exc.code().name)
                busy = False
            if not busy:
                self._stop.wait(self._poll_s)

    def run_once(self) -> bool:
        """Claim, copy and report one batch; True if there was work."""
        resp = self._stub.ClaimMoves(pb.ClaimMovesRequest(daemon_id=self._daemon_id,
                                                          max_bytes=self._batch_bytes), timeout=10)
        tasks = [wire.move_from_pb(t) for t in resp.tasks]
        if not tasks:
            return False
        results = [self._copy(t) for t in tasks]
        self._journal([t for t, (ok, _) in zip(tasks, results) if ok], results)
        self._stub.CompleteMoves(pb.CompleteMovesRequest(
            daemon_id=self._daemon_id,
            results=[pb.MoveResult(move_id=t.move_id, ok=ok, error=err) for t, (ok, err) in zip(tasks, results)]),
            timeout=10)
        self.moved += sum(ok for ok, _ in results)
        return True

    def _copy(self, task: MoveTask) -> tuple[bool, str]:
        src, dst = self._segments(task.src_segment_id), self._segments(task.dst_segment_id)
        if src is None or dst is None:
            return False, "segment not served by this daemon"
        try:
            src_view = src.view(task.src_offset, task.size)
            if src_view is not None:
                dst.write_from(task.dst_offset, src_view)
            else:
                dst_view = dst.view(task.dst_offset, task.size)
                if dst_view is None:
                    dst_view = memoryview(bytearray(task.size))
                    src.read_into(task.src_offset, dst_view)
                    dst.write_from(task.dst_offset, dst_view)
                else:
                    src.read_into(task.src_offset, dst_view)
            return True, ""
        except (OSError, ValueError) as exc:
            log.warning("move %d of %r failed: %s", task.move_id, task.key, exc)
            return False, str(exc)

    def _journal(self, done: list[MoveTask], results: list[tuple[bool, str]]) -> None:
        """Record blocks that landed on persistent segments, so a restart can re-announce them."""
        by_segment: dict[str, list[tuple[str, int, int, int]]] = defaultdict(list)
        for t in done:
            seg = self._segments(t.dst_segment_id)
            if seg is not None and seg.persistent:
                by_segment[t.dst_segment_id].append((t.key, t.dst_offset, t.size, t.checksum))
        for segment_id, records in by_segment.items():
            try:
                self._segments(segment_id).record_many(records)
            except OSError as exc:   # the bytes are there; only recovery after a restart loses them
                log.warning("journal of %s failed: %s", segment_id, exc)
