"""One worker's save batches: a block's key goes into `put_many` at most once at a time.

A step saves the blocks of every request it advanced, and requests that share a prefix carry the
same block hashes: the very same cache blocks when vLLM's prefix cache let a later request reuse
an earlier one's blocks in the same step, or copies computed side by side when it did not.
`put_many` refuses a batch that names a key twice (the whole batch: nothing is stored), and a key
that an earlier save is still writing gains nothing from a second write. So a batch keeps the
first occurrence of each hash and leaves out the hashes a save in flight is writing; the requests
that needed those wait for that save instead (its outcome is theirs).

Keys are tracked per (hash, layer): with "layer" granularity each layer's objects are their own
put_many, so the same block in two layers is two different keys; with "block" granularity the
layer is None.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

from kvstore.engines.vllm.metadata import BlockJob

_Key = tuple[bytes, "int | None"]


class SaveBatch(NamedTuple):
    """What one put_many of a step should carry, and what it leaves to others."""

    @property
    def block_ids(self) -> list[int]:
        """Single-group batches: the block of each hash."""
        return [ref[0] for ref in self.refs]

    hashes: list[bytes]  # each once, none being written by a save in flight
    refs: list[tuple[int, ...]]  # refs[i] holds hashes[i]: its block (1-tuple) or chunk (BlockJob.refs)
    waits: list[Future[Any]]  # saves in flight writing blocks these jobs also need
    repeated: int  # blocks left out: an earlier job of this batch has them
    in_flight: int  # blocks left out: a save in flight is writing them


class InFlightSaves:
    """The keys this worker's saves are writing now. Thread safe: saves finish on the save
    thread, batches are planned on vLLM's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writing: dict[_Key, Future[Any]] = {}

    def plan(self, jobs: Sequence[BlockJob], layer: int | None) -> SaveBatch:
        """The batch for `jobs` (one step's saves) and `layer` (None: whole blocks). Changes
        nothing: call `started` once the batch is submitted."""
        hashes: list[bytes] = []
        refs: list[tuple[int, ...]] = []
        waits: dict[int, Future[Any]] = {}
        seen: set[bytes] = set()
        repeated = in_flight = 0
        with self._lock:
            for job in jobs:
                for h, ref in zip(job.hashes, job.refs()):
                    if h in seen:
                        repeated += 1
                        continue
                    seen.add(h)
                    earlier = self._writing.get((h, layer))
                    if earlier is not None:
                        in_flight += 1
                        waits[id(earlier)] = earlier
                        continue
                    hashes.append(h)
                    refs.append(ref)
        return SaveBatch(hashes, refs, list(waits.values()), repeated, in_flight)

    def started(self, batch: SaveBatch, layer: int | None, future: Future[Any]) -> None:
        """`future` writes `batch`: later batches leave its keys out until it is done."""
        keys = [(h, layer) for h in batch.hashes]
        with self._lock:
            for key in keys:
                self._writing[key] = future
        future.add_done_callback(lambda done: self._finished(keys, done))

    def _finished(self, keys: list[_Key], future: Future[Any]) -> None:
        with self._lock:
            for key in keys:
                if self._writing.get(key) is future:
                    del self._writing[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._writing)
