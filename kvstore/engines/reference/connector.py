"""The reference engine's use of kvstore: prefix lookup, loads bounded by a deadline, saves that
overlap compute, and injected transfer failures for demos.

Nothing here raises a store error into the engine: a failed lookup is "nothing cached", a failed
or late load is "these leading blocks arrived", a failed save is "fewer blocks stored". The engine
recomputes whatever did not arrive, so every request completes. Transfers run on their own
threads and never block the engine's loop: the blocks they read or write are pinned in the cache
until they end, and the engine is woken when they do. Each part runs in a copy of the context the
transfer was started in, so the store client's log lines carry the request id the engine set for it.
"""

from __future__ import annotations

import contextvars
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from kvstore.client import KeyNotFound, KVStoreError, TransportError, Unavailable
from kvstore.engines.codec import KVBlockCodec, LoadResult, SaveResult
from kvstore.engines.keys import Granularity
from kvstore.engines.reference.paged_cache import PagedKVCache


class LoadDeadline(TransportError):
    """A KV load did not finish within its deadline; its blocks are recomputed instead."""


class InjectedFailure(TransportError):
    """A transfer failure made on purpose (demo / chaos testing)."""


def fallback_reason(error: KVStoreError | None) -> str:
    """The label a fallback is counted under."""
    if isinstance(error, LoadDeadline):
        return "deadline"
    if isinstance(error, InjectedFailure):
        return "injected"
    if isinstance(error, Unavailable):
        return "unavailable"
    if isinstance(error, KeyNotFound) or error is None:
        return "miss"
    return "transfer"


@dataclass(frozen=True)
class Lookup:
    cached_blocks: int
    error: KVStoreError | None = None


class FaultInjector:
    """Fails a fraction of loads part-way: a random leading run of blocks arrives, the rest not."""

    def __init__(self, load_failure_rate: float = 0.0, seed: int = 0) -> None:
        self.configure(load_failure_rate, seed)

    def configure(self, load_failure_rate: float, seed: int = 0) -> None:
        if not 0.0 <= load_failure_rate <= 1.0:
            raise ValueError(f"load_failure_rate {load_failure_rate} is not in [0, 1]")
        self.load_failure_rate = load_failure_rate
        self._rng = random.Random(seed)

    def cut(self, blocks: int) -> int | None:
        """None to load normally, else how many leading blocks to let through."""
        if blocks == 0 or self._rng.random() >= self.load_failure_rate:
            return None
        return self._rng.randrange(blocks)


class _Pinned:
    """Blocks pinned in the cache for a transfer made of parts: unpinned, and `wake` called, once
    the transfer is closed and its last part has ended (on whichever thread ends it)."""

    def __init__(self, cache: PagedKVCache, block_ids: Sequence[int], wake: Callable[[], None]) -> None:
        self._cache = cache
        self._ids = list(block_ids)
        self._wake = wake
        self._lock = threading.Lock()
        self._parts = 0
        self._closed = False
        self._released = False
        cache.pin(self._ids)

    def add(self, future: Future[Any]) -> None:
        with self._lock:
            self._parts += 1
        future.add_done_callback(self._part_done)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            last = self._parts == 0
        if last:
            self._release()

    @property
    def released(self) -> bool:
        return self._released

    def _part_done(self, _: Future[Any]) -> None:
        with self._lock:
            self._parts -= 1
            last = self._closed and self._parts == 0
        if last:
            self._release()

    def _release(self) -> None:
        self._cache.unpin(self._ids)
        self._released = True
        self._wake()


class PendingLoad:
    """A load of a sequence's leading blocks, in flight; its blocks are pinned until it ends."""

    def __init__(
        self,
        codec: KVBlockCodec,
        pool: ThreadPoolExecutor,
        cache: PagedKVCache,
        hashes: Sequence[bytes],
        block_ids: Sequence[int],
        cut: int | None,
        deadline_s: float,
        started: float,
        wake: Callable[[], None],
    ) -> None:
        self.requested = len(hashes)
        self.deadline_s = deadline_s
        self.deadline_at = started + deadline_s
        self._cut = cut
        want = len(hashes) if cut is None else cut
        self._pinned = _Pinned(cache, block_ids[: len(hashes)], wake)
        self._future = pool.submit(
            contextvars.copy_context().run, codec.load, list(hashes[:want]), list(block_ids[:want])
        )
        self._pinned.add(self._future)
        self._pinned.close()

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> LoadResult:
        """What arrived (waits if the load has not ended)."""
        result = self._future.result()
        if self._cut is not None:
            result = replace(
                result,
                blocks_requested=self.requested,
                error=result.error or InjectedFailure(f"injected failure after {self._cut} blocks"),
            )
        return result

    def expired(self) -> LoadResult:
        """The result of a load given up at its deadline: nothing usable arrived."""
        late = LoadDeadline(f"KV load of {self.requested} blocks passed its {self.deadline_s}s deadline")
        return LoadResult(self.requested, 0, 0, self.deadline_s, late)


class PendingSave:
    """A save of full blocks in progress, the blocks pinned until it ends: per layer as each
    layer's KV is computed (`layer_done`, LAYER granularity), or all at once at `close` (BLOCK
    granularity, or blocks computed earlier). `close` is called once no more layers come; then
    `done()` tells when it has ended."""

    def __init__(
        self,
        codec: KVBlockCodec,
        pool: ThreadPoolExecutor,
        cache: PagedKVCache,
        hashes: Sequence[bytes],
        block_ids: Sequence[int],
        wake: Callable[[], None],
    ) -> None:
        self._codec = codec
        self._pool = pool
        self._hashes = list(hashes)
        self._ids = list(block_ids)
        self._futures: list[Future[SaveResult]] = []
        self._per_layer = codec.granularity is Granularity.LAYER
        # Layers end inside a batch of many requests: parts run in the context of the save's start.
        self._context = contextvars.copy_context()
        self._pinned = _Pinned(cache, self._ids, wake)
        self._closed = False
        self._result: SaveResult | None = None

    @property
    def blocks(self) -> int:
        return len(self._hashes)

    def layer_done(self, layer: int) -> None:
        if self._per_layer and self._hashes and not self._closed:
            self._submit(
                self._pool.submit(self._context.copy().run, self._codec.save, self._hashes, self._ids, [layer])
            )

    def close(self) -> None:
        """No more layers: submit whatever is not on its way yet (all of it unless layers were
        saved one by one). Idempotent."""
        if not self._closed:
            if self._hashes and not self._futures:
                self._submit(self._pool.submit(self._context.copy().run, self._codec.save, self._hashes, self._ids))
            self._closed = True
            self._pinned.close()

    def done(self) -> bool:
        return self._closed and self._pinned.released

    def result(self) -> SaveResult:
        """Wait for every part (closing first); blocks_written counts blocks stored whole."""
        if self._result is None:
            self.close()
            parts = [f.result() for f in self._futures]
            if not parts:
                self._result = SaveResult(0, 0, 0, 0.0)
            else:
                error = next((p.error for p in parts if p.error is not None), None)
                self._result = SaveResult(
                    min(p.blocks_written for p in parts),
                    min(p.blocks_present for p in parts),
                    sum(p.nbytes for p in parts),
                    sum(p.seconds for p in parts),
                    error,
                )
        return self._result

    def _submit(self, future: Future[SaveResult]) -> None:
        self._futures.append(future)
        self._pinned.add(future)


class StoreConnector:
    def __init__(
        self,
        codec: KVBlockCodec,
        cache: PagedKVCache,
        load_deadline_s: float,
        faults: FaultInjector | None = None,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.codec = codec
        self.cache = cache
        self.load_deadline_s = load_deadline_s
        self.faults = faults or FaultInjector()
        self._wake = wake
        self._load_pool = ThreadPoolExecutor(2, thread_name_prefix="kv-load")
        self._save_pool = ThreadPoolExecutor(1, thread_name_prefix="kv-save")

    def close(self) -> None:
        """Wait for every transfer in flight (their blocks are unpinned as they end)."""
        self._load_pool.shutdown(wait=True)
        self._save_pool.shutdown(wait=True)

    def lookup(self, hashes: Sequence[bytes]) -> Lookup:
        try:
            return Lookup(self.codec.cached_blocks(hashes))
        except KVStoreError as exc:
            return Lookup(0, exc)

    def start_load(self, hashes: Sequence[bytes], table: Sequence[int], now: float) -> PendingLoad:
        """Start loading blocks 0..len(hashes)-1 of `table`; `wake` is called when it ends."""
        return PendingLoad(
            self.codec,
            self._load_pool,
            self.cache,
            hashes,
            table,
            self.faults.cut(len(hashes)),
            self.load_deadline_s,
            now,
            self._wake,
        )

    def start_save(self, hashes: Sequence[bytes], block_ids: Sequence[int]) -> PendingSave:
        return PendingSave(self.codec, self._save_pool, self.cache, hashes, block_ids, self._wake)
