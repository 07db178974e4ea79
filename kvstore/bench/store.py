"""Put and get throughput through a client, one key per call and batched.

Every timed put writes keys no earlier round wrote, each from its own source bytes (a distinct
slice of one random pool, so no value is served from the cache a previous put warmed), and every
get reads into preallocated numpy buffers (get_into / get_many_into: the zero-copy path). Gets
come from a *reader*, another client than the writer: "get" is its first read of each key, and
"get-warm" the same keys read again. Each phase's keys are removed (force) once it is measured,
so the store holds at most one phase's bytes. Every phase runs `plan.repeats` times; all of
them are kept.

The functions here drive any `KVTarget`, so other stores (`--compare`) are measured by the same
code through an adapter.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from kvstore.bench.results import Throughput

REMOVE_CHUNK = 4096


class KVTarget(Protocol):
    """The client calls a bench drives."""

    def put(self, key: str, value: Any) -> bool: ...
    def put_many(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]: ...
    def get_into(self, key: str, buffer: Any) -> int: ...
    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[Any]: ...
    def exists(self, key: str) -> bool: ...
    def match_prefix(self, keys: Sequence[str]) -> int: ...
    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Any]: ...

    def prepare(self, arrays: Sequence[np.ndarray]) -> None:
        """The memory later calls pass views of (a store that registers buffers does it here,
        untimed)."""


@dataclass(frozen=True)
class ThroughputPlan:
    """How much each timed phase moves: about `phase_bytes`, within the op and time bounds."""

    phase_bytes: int = 256 << 20
    max_single_ops: int = 300
    max_rounds: int = 32
    min_ops: int = 3
    max_batch_keys: int = 32
    max_batch_bytes: int = 32 << 20
    time_cap_s: float = 3.0
    repeats: int = 3  # every phase is measured this many times, and all are reported
    # Small values are also moved in wide batches, as an engine storing KV per layer does (tens of
    # thousands of objects per prompt): there the per-key cost of a put and a first get is what shows.
    wide_batch_keys: int = 1024
    wide_max_size: int = 4096

    def single_ops(self, size: int) -> int:
        return max(self.min_ops, min(self.max_single_ops, self.phase_bytes // size))

    def batch(self, size: int) -> int:
        return max(1, min(self.max_batch_keys, self.max_batch_bytes // size))

    def rounds(self, size: int) -> int:
        return max(self.min_ops, min(self.max_rounds, self.phase_bytes // (self.batch(size) * size)))

    def wide(self) -> ThroughputPlan:
        """This plan with wide batches: `wide_batch_keys` keys per call."""
        keys = self.wide_batch_keys
        room = max(self.max_batch_bytes, keys * self.wide_max_size)
        return dataclasses.replace(self, max_batch_keys=keys, max_batch_bytes=room)

    def pool_bytes(self, sizes: Sequence[int]) -> int:
        """Source bytes for every key of the largest phase (each key its own)."""
        wide = self.wide()

        def keys(s: int) -> int:
            widest = wide.rounds(s) * wide.batch(s) if s <= self.wide_max_size else 0
            return max(self.single_ops(s), self.rounds(s) * self.batch(s), widest)

        return max(keys(s) * s for s in sizes)


class SourcePool:
    """Random bytes that puts take their values from: value(i, size) is the i-th `size`-byte
    slice, so the keys of one phase never share source bytes."""

    def __init__(self, nbytes: int, seed: int = 0) -> None:
        words = np.random.default_rng(seed).bit_generator.random_raw(-(-nbytes // 8))
        self.array = np.asarray(words, dtype=np.uint64).view(np.uint8)[:nbytes]

    def value(self, i: int, size: int) -> np.ndarray:
        start = i * size
        if start + size > len(self.array):
            raise ValueError(f"source pool of {len(self.array)} bytes has no slice {i} of {size} bytes")
        return self.array[start : start + size]


def _timed(calls: Sequence[Callable[[], Any]], min_calls: int, time_cap_s: float) -> tuple[int, float]:
    """Run calls in order until all are done, or `time_cap_s` has passed after `min_calls`;
    returns (calls made, seconds)."""
    t0 = time.perf_counter()
    done = 0
    for call in calls:
        call()
        done += 1
        if done >= min_calls and time.perf_counter() - t0 > time_cap_s:
            break
    return done, time.perf_counter() - t0


def remove_all(target: KVTarget, keys: Sequence[str]) -> None:
    for i in range(0, len(keys), REMOVE_CHUNK):
        target.remove_many(keys[i : i + REMOVE_CHUNK], force=True)


def _verify(reader: KVTarget, keys: Sequence[str], values: Sequence[np.ndarray]) -> None:
    """Read the first, a middle and the last key once more and compare with what was put."""
    check = np.empty_like(values[0])
    for i in sorted({0, len(keys) // 2, len(keys) - 1}):
        n = reader.get_into(keys[i], check)
        if n != len(values[i]) or not np.array_equal(check[:n], values[i]):
            raise AssertionError(f"bench read back wrong bytes for {keys[i]!r}")


class _Runs:
    """(keys, seconds) per op over the repetitions of one measurement."""

    def __init__(self) -> None:
        self.runs: dict[str, list[tuple[int, float]]] = {}

    def add(self, op: str, keys: int, seconds: float) -> None:
        self.runs.setdefault(op, []).append((keys, seconds))

    def results(self, path: str, size: int, batch: int) -> list[Throughput]:
        out = []
        for op, runs in self.runs.items():
            # A time cap may cut a repetition short: keep each one's rate, at its own key count.
            per_key = [s / k for k, s in runs]
            keys = min(k for k, _ in runs)
            out.append(Throughput(path, op, size, batch, keys, tuple(t * keys for t in per_key)))
        return out


def measure_single(
    writer: KVTarget, reader: KVTarget, path: str, size: int, plan: ThroughputPlan, prefix: str, pool: SourcePool
) -> list[Throughput]:
    """put() then get_into() of distinct keys, one key per call: first reads, then again."""
    dst = np.empty(size, dtype=np.uint8)
    runs = _Runs()
    n = plan.single_ops(size)
    values = [pool.value(i, size) for i in range(n)]
    writer.prepare([pool.array])
    reader.prepare([dst])
    for r in range(plan.repeats):
        keys = [f"{prefix}/{r}/single/{i}" for i in range(n)]
        warm = f"{prefix}/{r}/single/warmup"
        writer.put(warm, values[-1])  # connect, map the segment
        reader.get_into(warm, dst)
        try:
            n_put, t_put = _timed(
                [partial(writer.put, k, v) for k, v in zip(keys, values)], plan.min_ops, plan.time_cap_s
            )
            written = keys[:n_put]
            n_get, t_get = _timed([partial(reader.get_into, k, dst) for k in written], n_put, plan.time_cap_s)
            n_warm, t_warm = _timed([partial(reader.get_into, k, dst) for k in written], n_put, plan.time_cap_s)
            _verify(reader, written, values)
        finally:
            remove_all(writer, [warm, *keys])
        runs.add("put", n_put, t_put)
        runs.add("get", n_get, t_get)
        runs.add("get-warm", n_warm, t_warm)
    return runs.results(path, size, 1)


def measure_batches(
    writer: KVTarget, reader: KVTarget, path: str, size: int, plan: ThroughputPlan, prefix: str, pool: SourcePool
) -> list[Throughput]:
    """measure_batched, and for a small size (<= plan.wide_max_size) again with wide batches."""
    out = measure_batched(writer, reader, path, size, plan, prefix, pool)
    if size <= plan.wide_max_size and plan.wide_batch_keys > plan.batch(size):
        out += measure_batched(writer, reader, path, size, plan.wide(), f"{prefix}/wide", pool)
    return out


def measure_batched(
    writer: KVTarget, reader: KVTarget, path: str, size: int, plan: ThroughputPlan, prefix: str, pool: SourcePool
) -> list[Throughput]:
    """put_many() then get_many_into() of distinct keys, `plan.batch(size)` keys per call: first
    reads, then again."""
    batch = plan.batch(size)
    rounds = plan.rounds(size)
    values = [[pool.value(r * batch + i, size) for i in range(batch)] for r in range(rounds)]
    dsts = [np.empty(size, dtype=np.uint8) for _ in range(batch)]
    writer.prepare([pool.array])
    reader.prepare(dsts)
    runs = _Runs()
    for rep in range(plan.repeats):
        batches = [[f"{prefix}/{rep}/batch/{r}/{i}" for i in range(batch)] for r in range(rounds)]
        warm = [f"{prefix}/{rep}/batch/warmup/{i}" for i in range(batch)]
        writer.put_many(warm, values[-1])
        reader.get_many_into(warm, dsts)
        try:
            n_put, t_put = _timed(
                [partial(writer.put_many, b, v) for b, v in zip(batches, values)],
                plan.min_ops,
                plan.time_cap_s,
            )
            written = batches[:n_put]
            reads = [partial(reader.get_many_into, b, dsts) for b in written]
            n_get, t_get = _timed(reads, n_put, plan.time_cap_s)
            n_warm, t_warm = _timed(reads, n_put, plan.time_cap_s)
            _verify(reader, [k for b in written for k in b], [v for vs in values[:n_put] for v in vs])
        finally:
            remove_all(writer, [k for b in (warm, *batches) for k in b])
        runs.add("put", n_put * batch, t_put)
        runs.add("get", n_get * batch, t_get)
        runs.add("get-warm", n_warm * batch, t_warm)
    return runs.results(path, size, batch)
