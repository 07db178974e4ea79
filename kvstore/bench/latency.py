"""Per-call latency of small operations, and match_prefix throughput on long key chains."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

from kvstore.bench.results import Latency, PrefixRate
from kvstore.bench.store import KVTarget, remove_all

# Shaped like real block keys: namespace / model / dtype-and-block-size / chained block hash.
KEY_FORMAT = "default/llama-7b/fp16-b16/{:016x}"


def _percentiles(path: str, op: str, size: int, calls: Sequence[Callable[[], Any]]) -> Latency:
    samples = np.empty(len(calls))
    for i, call in enumerate(calls):
        t0 = time.perf_counter()
        call()
        samples[i] = time.perf_counter() - t0
    p50, p99 = np.percentile(samples, [50, 99]) * 1e6
    return Latency(path, op, size, len(calls), float(p50), float(p99))


def measure_latency(target: KVTarget, path: str, size: int, ops: int, warmup: int, prefix: str) -> list[Latency]:
    """p50/p99 of exists, match_prefix (1 key), put and get_into of `size`-byte values, each
    timed over `ops` calls on distinct keys after `warmup` untimed calls of the same kind."""
    value = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(value)
    warm = [f"{prefix}/lat/warm/{i}" for i in range(warmup)]
    keys = [f"{prefix}/lat/{i}" for i in range(ops)]
    try:
        for k in warm:
            target.put(k, value)
            target.get_into(k, dst)
            target.exists(k)
            target.match_prefix([k])
        put = _percentiles(path, "put", size, [lambda k=k: target.put(k, value) for k in keys])
        get = _percentiles(path, "get", size, [lambda k=k: target.get_into(k, dst) for k in keys])
        exists = _percentiles(path, "exists", size, [lambda k=k: target.exists(k) for k in keys])
        match = _percentiles(path, "match_prefix", size, [lambda k=k: target.match_prefix([k]) for k in keys])
    finally:
        remove_all(target, warm + keys)
    return [exists, match, put, get]


def measure_prefix(target: KVTarget, batch: int, calls: int, prefix: str, repeats: int = 3,
                   value_size: int = 64) -> PrefixRate:
    """keys/s of match_prefix on `batch`-key chains that are all stored (so every key is walked):
    the fastest of `repeats` runs of `calls` calls."""
    keys = [f"{prefix}/" + KEY_FORMAT.format(i) for i in range(batch)]
    value = np.zeros(value_size, dtype=np.uint8)
    for i in range(0, batch, 256):
        chunk = keys[i:i + 256]
        target.put_many(chunk, [value] * len(chunk))
    try:
        for _ in range(2):
            found = target.match_prefix(keys)
            if found != batch:
                raise AssertionError(f"match_prefix found {found} of {batch} keys just stored")
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(calls):
                target.match_prefix(keys)
            best = min(best, time.perf_counter() - t0)
        return PrefixRate(batch, calls, best, repeats)
    finally:
        remove_all(target, keys)
