"""The replay driver: per request, one lookup of the prefix the store holds (`match_prefix` over
the request's block keys), one load of it (`get_many_into`) and one store of the rest
(`put_many`), each call timed. The hit is the leading run of blocks actually loaded (a block
evicted between the lookup and the load is a miss), in prompt tokens.

Keys are `{namespace}/{hash_id}`; a block's value is BlockValues' pattern of its hash id (distinct
per key, never zeros), and every load is checked against it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from kvstore.bench.trace.format import Request
from kvstore.bench.trace.pacing import Pacer
from kvstore.errors import KVStoreError
from kvstore.results import StoreStats

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: (h + 1) * _MIX is one-to-one over 64-bit h


class TraceTarget(Protocol):
    """What the replay calls (kvstore.client.KVClient is one)."""

    def match_prefix(self, keys: Sequence[str]) -> int: ...

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any], strict: bool = True) -> list[Any]: ...

    def put_many(self, keys: Sequence[str], values: Sequence[Any], replica_num: int | None = None) -> list[bool]: ...

    def stats(self) -> StoreStats: ...


class BlockValues:
    """Block values of `block_bytes`: each block's 64-bit words all equal to a mix of its hash id."""

    def __init__(self, block_bytes: int, max_blocks: int) -> None:
        self.words = block_bytes // 8
        self._out = np.empty((max_blocks, self.words), dtype=np.uint64)
        self._in = np.empty((max_blocks, self.words), dtype=np.uint64)

    @staticmethod
    def pattern(hash_ids: Sequence[int]) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (np.asarray(hash_ids, dtype=np.uint64) + np.uint64(1)) * _MIX

    def values(self, hash_ids: Sequence[int]) -> list[np.ndarray]:
        rows = self._out[: len(hash_ids)]
        rows[:] = self.pattern(hash_ids)[:, None]
        return list(rows)

    def buffers(self, n: int) -> list[np.ndarray]:
        return list(self._in[:n])

    def bad_loads(self, hash_ids: Sequence[int]) -> int:
        """How many of the first len(hash_ids) load buffers do not hold their block's pattern."""
        rows = self._in[: len(hash_ids)]
        return int((rows != self.pattern(hash_ids)[:, None]).any(axis=1).sum())


@dataclass
class CallTimes:
    lookup: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    store: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return sum(self.lookup) + sum(self.load) + sum(self.store)

    @property
    def calls(self) -> int:
        return len(self.lookup) + len(self.load) + len(self.store)


@dataclass
class ReplayLog:
    """What a replay saw, request by request, and its totals."""

    hit_tokens: list[int] = field(default_factory=list)
    times: CallTimes = field(default_factory=CallTimes)
    bytes_loaded: int = 0
    bytes_stored: int = 0
    blocks_stored: int = 0
    already_stored: int = 0  # blocks a put found stored (put after a lookup that stopped short)
    lost_between: int = 0  # blocks the lookup found that the load then missed (evicted meanwhile)
    bad_loads: int = 0  # loads whose bytes were not the block's: must stay 0
    failed_puts: int = 0  # put_many calls that raised (e.g. NoSpace); their blocks may be missing
    failed_loads: int = 0  # get_many_into calls that raised: their blocks count as missed
    first_error: str = ""
    peak_used: int = 0
    wall_s: float = 0.0
    stats_s: float = 0.0  # time in the stats() samples (not a replay call)


def replay(
    requests: Sequence[Request],
    target: TraceTarget,
    namespace: str,
    block_bytes: int,
    pacer: Pacer | None = None,
    on_request: Callable[[int, ReplayLog], None] | None = None,
    samples: int = 20,
) -> ReplayLog:
    """Replay `requests` in order against `target`; `on_request(i, log)` after each (progress)."""
    log = ReplayLog()
    values = BlockValues(block_bytes, max((len(r.hash_ids) for r in requests), default=1))
    sample_every = max(1, len(requests) // max(1, samples))
    pacer = pacer or Pacer(0)
    clock = time.perf_counter
    start = clock()
    for i, request in enumerate(requests):
        pacer.wait(request.timestamp_ms)
        ids = request.hash_ids
        keys = [f"{namespace}/{h}" for h in ids]
        t0 = clock()
        held = target.match_prefix(keys)
        t1 = clock()
        log.times.lookup.append(t1 - t0)
        loaded = 0
        if held:
            try:
                results = target.get_many_into(keys[:held], values.buffers(held), strict=False)
            except Exception as exc:  # noqa: BLE001 - a load that fails is a miss, as for an engine: counted, reported
                log.failed_loads += 1
                log.first_error = log.first_error or f"load: {type(exc).__name__}: {exc}"
                results = []
            t2 = clock()
            log.times.load.append(t2 - t1)
            while loaded < len(results) and not isinstance(results[loaded], KVStoreError):
                loaded += 1
            log.lost_between += len(results) - loaded
            log.bytes_loaded += sum(r for r in results if isinstance(r, int))
            log.bad_loads += values.bad_loads(ids[:loaded])
        log.hit_tokens.append(request.tokens_in(loaded))
        if loaded < len(ids):
            rest = ids[loaded:]
            data = values.values(rest)
            t3 = clock()
            try:
                written = target.put_many(keys[loaded:], data)
            except Exception as exc:  # noqa: BLE001 - e.g. NoSpace: counted and reported, the replay goes on
                log.failed_puts += 1
                log.first_error = log.first_error or f"store: {type(exc).__name__}: {exc}"
                written = []
            log.times.store.append(clock() - t3)
            log.blocks_stored += sum(written)
            log.already_stored += len(written) - sum(written)
            log.bytes_stored += sum(written) * block_bytes
        if i % sample_every == sample_every - 1 or i == len(requests) - 1:
            t4 = clock()
            log.peak_used = max(log.peak_used, target.stats().used)
            log.stats_s += clock() - t4
        if on_request is not None:
            on_request(i, log)
    log.wall_s = clock() - start
    return log
