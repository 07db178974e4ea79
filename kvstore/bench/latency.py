"""Per-call latency of small operations, the server CPU each costs, and match_prefix throughput
on long key chains. Every loop runs `repeats` times on fresh keys; all repetitions are kept."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from kvstore.bench.results import Latency, PrefixRate, ServerCpu, Spread
from kvstore.bench.store import KVTarget, SourcePool, remove_all

# Shaped like real block keys: namespace / model / dtype-and-block-size / chained block hash.
KEY_FORMAT = "default/llama-7b/fp16-b16/{:016x}"


@dataclass(frozen=True)
class LatencyPlan:
    size: int = 4 << 10
    ops: int = 500  # timed calls per operation and repetition
    warmup: int = 50
    repeats: int = 3


CpuClock = Callable[[], float]  # CPU seconds the store's server processes have used so far


def samples(calls: Sequence[Callable[[], Any]]) -> np.ndarray:
    """Seconds each call took."""
    took = np.empty(len(calls))
    for i, call in enumerate(calls):
        t0 = time.perf_counter()
        call()
        took[i] = time.perf_counter() - t0
    return took


class _Collected:
    def __init__(self) -> None:
        self.p50: dict[str, list[float]] = {}
        self.p99: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def add(self, op: str, took: np.ndarray) -> None:
        p50, p99 = np.percentile(took, [50, 99]) * 1e6
        self.p50.setdefault(op, []).append(float(p50))
        self.p99.setdefault(op, []).append(float(p99))

    def add_cpu(self, op: str, seconds: float, calls: int) -> None:
        self.cpu.setdefault(op, []).append(seconds / calls * 1e6)


def measure_latency(
    writer: KVTarget,
    reader: KVTarget,
    path: str,
    plan: LatencyPlan,
    prefix: str,
    pool: SourcePool,
    cpu: CpuClock | None = None,
    cpu_what: str = "",
) -> tuple[list[Latency], list[ServerCpu]]:
    """p50/p99 of exists, match_prefix (1 key), put (writer), get_into of keys the reader never
    read ("get") and of the same keys again ("get-warm"), each over `plan.ops` distinct keys after
    `plan.warmup` untimed calls of the same kind, `plan.repeats` times. With `cpu`, also the server
    CPU per put, per first get and per pair of them."""
    size = plan.size
    values = [pool.value(i, size) for i in range(plan.ops)]
    dst = np.empty(size, dtype=np.uint8)
    writer.prepare([pool.array])
    reader.prepare([dst])
    out = _Collected()
    for rep in range(plan.repeats):
        warm = [f"{prefix}/{rep}/lat/warm/{i}" for i in range(plan.warmup)]
        keys = [f"{prefix}/{rep}/lat/{i}" for i in range(plan.ops)]
        try:
            for k in warm:
                writer.put(k, values[0])
                reader.get_into(k, dst)
                reader.get_into(k, dst)
                reader.exists(k)
                reader.match_prefix([k])
            c0 = cpu() if cpu else 0.0
            out.add("put", samples([partial(writer.put, k, v) for k, v in zip(keys, values)]))
            c1 = cpu() if cpu else 0.0
            out.add("get", samples([partial(reader.get_into, k, dst) for k in keys]))
            c2 = cpu() if cpu else 0.0
            out.add("get-warm", samples([partial(reader.get_into, k, dst) for k in keys]))
            c3 = cpu() if cpu else 0.0
            out.add("exists", samples([partial(reader.exists, k) for k in keys]))
            out.add("match_prefix", samples([partial(reader.match_prefix, [k]) for k in keys]))
            if cpu:
                out.add_cpu("put", c1 - c0, plan.ops)
                out.add_cpu("get", c2 - c1, plan.ops)
                out.add_cpu("get-warm", c3 - c2, plan.ops)
                out.add_cpu("pair", c2 - c0, plan.ops)
        finally:
            remove_all(writer, warm + keys)
    latencies = [
        Latency(path, op, size, plan.ops, Spread.of(out.p50[op]), Spread.of(out.p99[op]))
        for op in ("exists", "match_prefix", "put", "get", "get-warm")
    ]
    cpus = [ServerCpu(path, op, size, Spread.of(v), cpu_what) for op, v in out.cpu.items()]
    return latencies, cpus


def measure_prefix(
    target: KVTarget, batch: int, calls: int, prefix: str, repeats: int = 3, value_size: int = 64
) -> PrefixRate:
    """keys/s of match_prefix on `batch`-key chains that are all stored (so every key is walked):
    `repeats` runs of `calls` calls."""
    keys = [f"{prefix}/" + KEY_FORMAT.format(i) for i in range(batch)]
    value = np.zeros(value_size, dtype=np.uint8)
    for i in range(0, batch, 256):
        chunk = keys[i : i + 256]
        target.put_many(chunk, [value] * len(chunk))
    try:
        for _ in range(2):
            found = target.match_prefix(keys)
            if found != batch:
                raise AssertionError(f"match_prefix found {found} of {batch} keys just stored")
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                target.match_prefix(keys)
            runs.append(time.perf_counter() - t0)
        return PrefixRate(batch, calls, tuple(runs))
    finally:
        remove_all(target, keys)
