"""Store and load jobs: bytes straight between the primary tier's slots and the store.

`submit_store` / `submit_load` hand a job to a small pool of threads and return at once (they run
in vLLM's scheduler). A store job is one `put_many` of the chunks' slices of the primary tier's
memory; a load job is one `get_many_into` into the slices of the slots vLLM allocated. Nothing is
copied on the way. Every job ends in exactly one `JobResult`, collected by the scheduler thread:
a load reports per key which chunks arrived whole (a chunk of the wrong size, a miss, a dead
daemon are failures), and an exception of any kind fails the job instead of losing it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob

from kvstore.client import KVClient
from kvstore.engines.vllm.tier.naming import TierKeys
from kvstore.errors import KeyNotFound, KVStoreError
from kvstore.types import MAX_BATCH_KEYS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    """A job's result, with what the tier reports about its keys."""

    result: JobResult
    is_load: bool
    stored: tuple[OffloadKey, ...] = ()  # keys this store job wrote (or found already stored)
    failed: tuple[OffloadKey, ...] = ()  # keys this load job could not load
    missing: tuple[OffloadKey, ...] = ()  # of those, the keys the store no longer holds


class Jobs:
    def __init__(self, client: KVClient, keys: TierKeys, primary: memoryview, payload_bytes: int, threads: int) -> None:
        self._client = client
        self._keys = keys
        self._primary = primary.cast("B")  # the primary tier's memory, as bytes
        self._stride = primary.strides[0] if primary.strides else payload_bytes
        self._payload = payload_bytes
        self._pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="kvstore-tier-io")
        self._finished: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._running = 0
        self._idle = threading.Condition()

    def _slices(self, chunk_ids: Iterable[Any]) -> list[memoryview]:
        stride, size, primary = self._stride, self._payload, self._primary
        return [primary[int(c) * stride : int(c) * stride + size] for c in chunk_ids]

    def submit(self, job: TransferJob) -> None:
        keys = list(job.keys)
        if len(keys) != len(job.chunk_ids):
            raise ValueError(f"job {job.job_id}: {len(keys)} keys but {len(job.chunk_ids)} chunk ids")
        with self._idle:
            self._running += 1
        self._pool.submit(self._run, job, keys)

    def finished(self) -> list[Finished]:
        out = []
        while True:
            try:
                out.append(self._finished.get_nowait())
            except queue.Empty:
                return out

    @property
    def running(self) -> int:
        return self._running

    def wait_idle(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0)

    def close(self) -> None:
        self.wait_idle()
        self._pool.shutdown(wait=True)
        self._primary.release()  # so vLLM can close the primary tier's mapping

    def _run(self, job: TransferJob, keys: list[OffloadKey]) -> None:
        start = time.monotonic()
        try:
            done = self._load(job, keys, start) if job.is_promotion else self._store(job, keys, start)
        except Exception as exc:  # noqa: BLE001 - never lose a job: it fails, and says why in the log
            log.warning("kvstore tier: job %d (%d chunk(s)) failed: %s", job.job_id, len(keys), exc)
            failed = tuple(keys) if job.is_promotion else ()
            done = Finished(JobResult(job.job_id, False), job.is_promotion, failed=failed)
        self._finished.put(done)
        with self._idle:
            self._running -= 1
            self._idle.notify_all()

    def _store(self, job: TransferJob, keys: list[OffloadKey], start: float) -> Finished:
        names = self._keys.many(keys)
        views = self._slices(job.chunk_ids)
        ok = True
        for at in range(0, len(names), MAX_BATCH_KEYS):
            try:  # False per key: already stored, by this or another instance; nothing to move
                self._client.put_many(names[at : at + MAX_BATCH_KEYS], views[at : at + MAX_BATCH_KEYS])
            except KVStoreError as exc:
                log.warning("kvstore tier: storing %d chunk(s) failed: %s", len(names[at:]), exc)
                ok = False
        moved = len(keys) * self._payload
        result = JobResult(job.job_id, ok, transfer_time=time.monotonic() - start, transfer_bytes=moved)
        return Finished(result, False, stored=tuple(keys) if ok else ())

    def _load(self, job: TransferJob, keys: list[OffloadKey], start: float) -> Finished:
        names = self._keys.many(keys)
        views = self._slices(job.chunk_ids)
        got: list[int | KVStoreError] = []
        for at in range(0, len(names), MAX_BATCH_KEYS):
            part = names[at : at + MAX_BATCH_KEYS]
            try:
                got += self._client.get_many_into(part, views[at : at + MAX_BATCH_KEYS], strict=False)
            except KVStoreError as exc:  # the whole call failed (e.g. the service is down)
                got += [exc] * len(part)
        good = [k for k, n in zip(keys, got) if n == self._payload]
        failed = tuple(k for k, n in zip(keys, got) if n != self._payload)
        missing = tuple(k for k, n in zip(keys, got) if isinstance(n, KeyNotFound))
        for key, n in zip(keys, got):
            if n != self._payload and not isinstance(n, KVStoreError):
                log.warning(
                    "kvstore tier: %s holds %s bytes, not a %d-byte chunk", self._keys.of(key), n, self._payload
                )
        elapsed = time.monotonic() - start
        if not failed:
            result = JobResult(job.job_id, True, transfer_time=elapsed, transfer_bytes=len(keys) * self._payload)
        else:
            result = JobResult(
                job.job_id, False, successful_keys=tuple(good) or None,
                transfer_time=elapsed, transfer_bytes=len(good) * self._payload,
            )  # fmt: skip
        return Finished(result, True, failed=failed, missing=missing)
