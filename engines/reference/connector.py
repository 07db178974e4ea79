"""The reference engine's use of kvstore: prefix lookup, loads bounded by a deadline, saves that
overlap compute, and injected transfer failures for demos.

Nothing here raises a store error into the engine: a failed lookup is "nothing cached", a failed
or late load is "these leading blocks arrived", a failed save is "fewer blocks stored". The engine
recomputes whatever did not arrive, so every request completes.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, replace
from typing import Sequence

from kvstore.client import KeyNotFound, KVStoreError, TransportError, Unavailable
from kvstore.engines.codec import Granularity, KVBlockCodec, LoadResult, SaveResult
from kvstore.engines.reference.paged_cache import CacheFull, PagedKVCache


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


@dataclass(frozen=True)
class LoadOutcome:
    result: LoadResult
    table: list[int]                    # the block table to use from now on (new after a deadline)


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


class PendingSave:
    """A save of new blocks in progress: per layer as each layer's KV is computed (LAYER
    granularity), or all at once at `finish` (BLOCK)."""

    def __init__(self, codec: KVBlockCodec, pool: ThreadPoolExecutor, hashes: Sequence[bytes],
                 block_ids: Sequence[int]) -> None:
        self._codec = codec
        self._pool = pool
        self._hashes = list(hashes)
        self._ids = list(block_ids)
        self._futures: list[Future[SaveResult]] = []
        self._per_layer = codec.granularity is Granularity.LAYER
        self._result: SaveResult | None = None

    def layer_done(self, layer: int) -> None:
        if self._per_layer and self._hashes:
            self._futures.append(self._pool.submit(self._codec.save, self._hashes, self._ids, [layer]))

    def finish(self) -> SaveResult:
        """Wait for every part; idempotent. blocks_written counts blocks stored whole."""
        if self._result is None:
            if not self._per_layer and self._hashes:
                self._futures.append(self._pool.submit(self._codec.save, self._hashes, self._ids))
            parts = [f.result() for f in self._futures]
            if not parts:
                self._result = SaveResult(0, 0, 0, 0.0)
            else:
                error = next((p.error for p in parts if p.error is not None), None)
                self._result = SaveResult(min(p.blocks_written for p in parts),
                                          min(p.blocks_present for p in parts),
                                          sum(p.nbytes for p in parts), sum(p.seconds for p in parts), error)
        return self._result


class StoreConnector:
    def __init__(self, codec: KVBlockCodec, cache: PagedKVCache, load_deadline_s: float,
                 faults: FaultInjector | None = None) -> None:
        self.codec = codec
        self.cache = cache
        self.load_deadline_s = load_deadline_s
        self.faults = faults or FaultInjector()
        self._load_pool = ThreadPoolExecutor(2, thread_name_prefix="kv-load")
        self._save_pool = ThreadPoolExecutor(1, thread_name_prefix="kv-save")
        self._lock = threading.Lock()

    def close(self) -> None:
        self._load_pool.shutdown(wait=True)
        self._save_pool.shutdown(wait=True)

    def lookup(self, hashes: Sequence[bytes]) -> Lookup:
        try:
            return Lookup(self.codec.cached_blocks(hashes))
        except KVStoreError as exc:
            return Lookup(0, exc)

    def load(self, hashes: Sequence[bytes], table: list[int]) -> LoadOutcome:
        """Load blocks 0..len(hashes)-1 of `table`. At the deadline the blocks are abandoned to the
        still-running transfer (freed when it ends, so late bytes land nowhere in use) and the
        sequence continues in fresh blocks."""
        cut = self.faults.cut(len(hashes))
        want = list(hashes) if cut is None else list(hashes[:cut])
        future = self._load_pool.submit(self.codec.load, want, table[:len(want)])
        try:
            result = future.result(timeout=self.load_deadline_s)
        except FutureTimeout:
            try:
                fresh = self.cache.allocate(len(table))
            except CacheFull:                   # nowhere to go: wait for the transfer after all
                return LoadOutcome(future.result(), table)
            future.add_done_callback(lambda _: self.cache.free(table))
            late = LoadDeadline(f"KV load of {len(want)} blocks passed its {self.load_deadline_s}s deadline")
            return LoadOutcome(LoadResult(len(hashes), 0, 0, self.load_deadline_s, late), fresh)
        if cut is not None:
            result = replace(result, blocks_requested=len(hashes),
                             error=result.error or InjectedFailure(f"injected failure after {cut} blocks"))
        return LoadOutcome(result, table)

    def start_save(self, hashes: Sequence[bytes], block_ids: Sequence[int]) -> PendingSave:
        return PendingSave(self.codec, self._save_pool, hashes, block_ids)
