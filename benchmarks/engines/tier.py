"""kvstore as vLLM's secondary offloading tier, measured (`python -m benchmarks.engines.tier`).

Driven by vLLM's own TieringOffloadingManager (benchmarks/engines/tiering.py) over a real
`kvstore serve`, in trace order, min / median / max of `--runs`:

- lookups: store calls per scheduler step, for a step in which REQUESTS requests ask about N chunks
  each (the target is 1, not one per key or per request);
- load: chunks moved store -> primary tier per second by the tier's load job (from the step that
  submits it until it is done), against the ceiling of the same client call, `get_many_into` of the
  same chunks into a buffer of the same size, first read by a new client each time (target >= 0.8);
- step: the scheduler thread's time for one step (every lookup of the step, then on_schedule_end),
  with the tier against the same manager without it, at 0 and at `--pending` new keys; the store
  answers on another thread, so the difference is what the tier adds to the step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from benchmarks.engines.tiering import STEP, Engine, offload_keys, payloads, tier_config
from kvstore.client import KVClient
from kvstore.engines.launch import Fleet


def _spread(values: list[float]) -> str:
    return f"min {min(values):.3g}  median {statistics.median(values):.3g}  max {max(values):.3g}"


def lookups_per_step(meta: str, requests: int, per_request: int) -> int:
    engine = Engine([tier_config(meta)], chunks=8)
    try:
        before = engine.tier._lookups.calls
        for r in range(requests):
            ctx = ReqContext(f"lookup-{r}")
            engine.manager.on_new_request(ctx)
            engine.lookup(ctx, offload_keys(200 + r, per_request))
        engine.step()
        engine.settle()
        return engine.tier._lookups.calls - before
    finally:
        engine.close()


def load_rates(meta: str, chunks: int, chunk_bytes: int, runs: int) -> tuple[list[float], list[float]]:
    """GB/s of the tier's load jobs and of the raw get_many_into, one pair per run."""
    writer = Engine([tier_config(meta)], chunks=chunks, chunk_bytes=chunk_bytes)
    keys, values = offload_keys(100, chunks), payloads(100, chunks, chunk_bytes)
    writer.store("writer", keys, values)
    names = writer.tier.keys.many(keys)
    tier_rates, raw_rates = [], []
    try:
        for run in range(runs):
            order: list[Callable[[], float]] = [
                lambda: _tier_load(meta, keys, values, chunk_bytes),
                lambda: _raw_load(meta, names, chunk_bytes),
            ]
            if run % 2:
                order.reverse()
            results = [f() for f in order]
            tier_s, raw_s = results if run % 2 == 0 else results[::-1]
            tier_rates.append(chunks * chunk_bytes / tier_s / 1e9)
            raw_rates.append(chunks * chunk_bytes / raw_s / 1e9)
    finally:
        writer.close()
    return tier_rates, raw_rates


def _tier_load(meta: str, keys: list[OffloadKey], values: list[bytes], chunk_bytes: int) -> float:
    engine = Engine([tier_config(meta)], chunks=len(keys), chunk_bytes=chunk_bytes)
    try:
        ctx = ReqContext("reader")
        engine.manager.on_new_request(ctx)
        engine.lookup(ctx, keys)
        engine.step()
        engine.settle()
        assert set(engine.lookup(ctx, keys)) == {LookupResult.HIT_PENDING}
        start = time.perf_counter()
        engine.step()  # submits the load job
        engine.tier.drain_jobs()
        elapsed = time.perf_counter() - start
        engine.step()
        got = engine.load("check", keys)
        assert got == values, "the tier loaded other bytes than were stored"
        engine.manager.on_request_finished(ctx)
        return elapsed
    finally:
        engine.close()


def _raw_load(meta: str, names: list[str], chunk_bytes: int) -> float:
    buffer = bytearray(b"\1" * (len(names) * chunk_bytes))  # written once: its pages are mapped, as the tier's are
    view = memoryview(buffer)
    views = [view[i * chunk_bytes : (i + 1) * chunk_bytes] for i in range(len(names))]
    with KVClient(meta) as client:
        assert all(client.exists_many(names))  # as the tier looks chunks up before it loads them
        start = time.perf_counter()
        got = client.get_many_into(names, views)
        elapsed: float = time.perf_counter() - start
    assert got == [chunk_bytes] * len(names)
    return elapsed


def step_times(meta: str, pending: int, runs: int) -> dict[str, list[float]]:
    """Microseconds of scheduler-thread time per step, with and without the tier."""
    out: dict[str, list[float]] = {}
    for label, tiers in (("without the tier", []), ("with the tier", [tier_config(meta)])):
        for n in (0, pending):
            times = []
            for run in range(runs):
                engine = Engine(list(tiers), chunks=8)
                try:
                    ctx = ReqContext("step")
                    engine.manager.on_new_request(ctx)
                    keys = offload_keys(1000 + run, n) if n else []
                    start = time.perf_counter()
                    engine.lookup(ctx, keys)
                    engine.manager.on_schedule_end(STEP)
                    times.append((time.perf_counter() - start) * 1e6)
                    if tiers:
                        engine.settle()
                    engine.manager.on_request_finished(ctx)
                finally:
                    engine.close()
            out[f"{label}, {n} new keys"] = times
    return out


def run(args: argparse.Namespace) -> int:
    with Fleet() as fleet:
        meta = args.meta or fleet.store("1GiB")[1]
        calls = lookups_per_step(meta, args.requests, args.pending // args.requests)
        each = args.pending // args.requests
        print(f"lookups: {args.requests} requests x {each} chunks in one step -> {calls} store call(s)")
        tier, raw = load_rates(meta, args.chunks, args.chunk_kib * 1024, args.runs)
        ratios = [t / r for t, r in zip(tier, raw)]
        print(f"load {args.chunks} x {args.chunk_kib} KiB, store -> primary tier, GB/s")
        print(f"  tier load job       {_spread(tier)}")
        print(f"  raw get_many_into   {_spread(raw)}")
        print(f"  ratio tier / raw    {_spread(ratios)}   (target >= 0.8)")
        print("scheduler step, microseconds on the scheduler thread")
        for label, times in step_times(meta, args.pending, args.runs).items():
            print(f"  {label:<34} {_spread(times)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engines.tier", description=__doc__)
    parser.add_argument("--meta", default=None, help="use this store (default: start `kvstore serve`)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=128, help="chunks per load")
    parser.add_argument("--chunk-kib", type=int, default=256, help="bytes of one chunk's KV, in KiB")
    parser.add_argument("--pending", type=int, default=1000, help="new keys in the busy step")
    parser.add_argument("--requests", type=int, default=10, help="requests the busy step's keys belong to")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
