"""Put and get throughput through the client, one key per call and batched.

Every timed put writes keys no earlier round wrote, and every get reads into preallocated numpy
buffers (get_into / get_many_into: the zero-copy path). Each phase's keys are removed (force) once
it is measured, so the store holds at most one phase's bytes.

The functions here drive any `KVTarget`, so another store (e.g. for a later `--compare`) can be
measured by the same code through an adapter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from kvstore.bench.results import Throughput

REMOVE_CHUNK = 4096


class KVTarget(Protocol):
    """The client calls a bench drives; KVClient has them all."""

    def put(self, key: str, value: Any) -> bool: ...
    def put_many(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]: ...
    def get_into(self, key: str, buffer: Any) -> int: ...
    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[Any]: ...
    def exists(self, key: str) -> bool: ...
    def match_prefix(self, keys: Sequence[str]) -> int: ...
    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Any]: ...


@dataclass(frozen=True)
class ThroughputPlan:
    """How much each timed phase moves: about `phase_bytes`, within the op and time bounds."""

    phase_bytes: int = 256 << 20
    max_single_ops: int = 300
    max_rounds: int = 32
    min_ops: int = 3
    max_batch_keys: int = 256
    max_batch_bytes: int = 32 << 20
    time_cap_s: float = 3.0
    repeats: int = 3                  # each phase is measured this many times; the best is kept,
                                      # as for the ceilings it is compared with

    def single_ops(self, size: int) -> int:
        return max(self.min_ops, min(self.max_single_ops, self.phase_bytes // size))

    def batch(self, size: int) -> int:
        return max(1, min(self.max_batch_keys, self.max_batch_bytes // size))

    def rounds(self, size: int) -> int:
        return max(self.min_ops, min(self.max_rounds, self.phase_bytes // (self.batch(size) * size)))


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
        target.remove_many(keys[i:i + REMOVE_CHUNK], force=True)


def _check(dst: np.ndarray, value: np.ndarray, key: str) -> None:
    if not np.array_equal(dst, value):
        raise AssertionError(f"bench read back wrong bytes for {key!r}")


def best_of(repeats: int, measure: Callable[[int], list[Throughput]]) -> list[Throughput]:
    """measure(repeat) `repeats` times; per result position, the fastest run."""
    runs = [measure(r) for r in range(repeats)]
    return [replace(max(same, key=lambda t: t.ops_per_s), repeats=repeats) for same in zip(*runs)]


def measure_single(target: KVTarget, path: str, size: int, plan: ThroughputPlan, prefix: str) -> list[Throughput]:
    """put() then get_into() of distinct keys, one key per call."""
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(value)
    keys = [f"{prefix}/single/{i}" for i in range(plan.single_ops(size))]
    warm = f"{prefix}/single/warmup"
    target.put(warm, value)                 # connect, map the segment, fault pages in
    target.get_into(warm, dst)
    try:
        n_put, t_put = _timed([lambda k=k: target.put(k, value) for k in keys], plan.min_ops, plan.time_cap_s)
        written = keys[:n_put]
        n_get, t_get = _timed([lambda k=k: target.get_into(k, dst) for k in written], plan.min_ops,
                              plan.time_cap_s)
        _check(dst, value, written[n_get - 1])
    finally:
        remove_all(target, [warm, *keys])
    return [Throughput(path, "put", size, 1, n_put, t_put), Throughput(path, "get", size, 1, n_get, t_get)]


def measure_batched(target: KVTarget, path: str, size: int, plan: ThroughputPlan, prefix: str) -> list[Throughput]:
    """put_many() then get_many_into() of distinct keys, `plan.batch(size)` keys per call."""
    batch = plan.batch(size)
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    values = [value] * batch
    dsts = [np.empty_like(value) for _ in range(batch)]
    batches = [[f"{prefix}/batch/{r}/{i}" for i in range(batch)] for r in range(plan.rounds(size))]
    warm = [f"{prefix}/batch/warmup/{i}" for i in range(batch)]
    target.put_many(warm, values)
    target.get_many_into(warm, dsts)
    try:
        n_put, t_put = _timed([lambda b=b: target.put_many(b, values) for b in batches], plan.min_ops,
                              plan.time_cap_s)
        written = batches[:n_put]
        n_get, t_get = _timed([lambda b=b: target.get_many_into(b, dsts) for b in written], plan.min_ops,
                              plan.time_cap_s)
        _check(dsts[-1], value, written[n_get - 1][-1])
    finally:
        remove_all(target, [k for b in (warm, *batches) for k in b])
    return [Throughput(path, "put", size, batch, n_put * batch, t_put),
            Throughput(path, "get", size, batch, n_get * batch, t_get)]
