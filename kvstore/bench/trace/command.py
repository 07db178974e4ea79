"""`kvstore bench trace FILE`: for each capacity, a fresh store (meta + one daemon whose DRAM holds
that many tokens of scaled KV; or the store at --meta), the trace replayed against it, and the same
trace through the exact LRU at the store's capacity and the infinite cache; then the tables, plots
and JSON (report.py, png.py)."""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

from kvstore.bench.cpu import CpuMeter
from kvstore.bench.procs import LocalStore
from kvstore.bench.trace import png
from kvstore.bench.trace.format import BLOCK_TOKENS, Request, read_trace
from kvstore.bench.trace.options import TraceOptions, options_from_args
from kvstore.bench.trace.pacing import Pacer
from kvstore.bench.trace.replay import ReplayLog, replay
from kvstore.bench.trace.report import render, size, tokens
from kvstore.bench.trace.results import HitRates, Latency, PointResult, Throughput, rate, timeline
from kvstore.bench.trace.sim import InfiniteCache, LRUCache, SimResult, simulate
from kvstore.client import KVClient
from kvstore.results import StoreStats
from kvstore.types import Tier


def progress(message: str) -> None:
    print(f"bench trace: {message}", file=sys.stderr, flush=True)


class ProgressBar:
    """Requests replayed, on stderr: redrawn in place on a terminal, a line every tenth otherwise."""

    def __init__(self, total: int, label: str) -> None:
        self.total = total
        self.label = label
        self.tty = sys.stderr.isatty()
        self._last = 0.0
        self._start = time.perf_counter()

    def update(self, i: int, log: ReplayLog) -> None:
        done = i + 1
        now = time.perf_counter()
        if self.tty and now - self._last < 0.2 and done < self.total:
            return
        if not self.tty and done % max(1, self.total // 10) and done < self.total:
            return
        self._last = now
        filled = done * 30 // self.total
        rps = done / max(now - self._start, 1e-9)
        line = f"{self.label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} requests, {rps:.0f}/s"
        print(("\r" + line) if self.tty else line, end="" if self.tty and done < self.total else "\n", file=sys.stderr)


def dram_capacity(stats: StoreStats) -> int:
    return next((t.capacity for t in stats.tiers if t.tier is Tier.DRAM), stats.capacity)


def run_point(
    options: TraceOptions, requests: Sequence[Request], capacity: int | None, infinite: SimResult
) -> PointResult:
    """Replay against a fresh store of `capacity` tokens (None: the one at --meta)."""
    kv = options.kv
    store: LocalStore | None = None
    address = options.meta or ""
    if capacity is not None:
        progress(f"starting meta + daemon: {tokens(capacity)} tokens of KV, {size(kv.store_bytes(capacity))} DRAM")
        store = LocalStore(kv.store_bytes(capacity), kv.segment_bytes(capacity)).start()
        address = store.meta_address
    try:
        with KVClient(address) as client:
            before = client.stats()
            capacity_bytes = dram_capacity(before)
            cpu = CpuMeter([p.pid for p in store.procs], "meta + daemon") if store and CpuMeter.available() else None
            cpu_start = cpu() if cpu else 0.0
            pacer = Pacer(options.speed)
            bar = ProgressBar(len(requests), tokens(capacity or capacity_bytes // kv.block_bytes * BLOCK_TOKENS))
            log = replay(requests, client, f"trace/{secrets.token_hex(4)}", kv.block_bytes, pacer, bar.update)
            cpu_s = cpu() - cpu_start if cpu else None
            after = client.stats()
    finally:
        if store is not None:
            store.close()
    blocks = capacity_bytes // kv.block_bytes
    lru = simulate(requests, LRUCache(blocks))
    busy = log.wall_s - pacer.slept_s
    return PointResult(
        capacity_tokens=capacity or blocks * BLOCK_TOKENS,
        capacity_blocks=blocks,
        capacity_bytes=capacity_bytes,
        requests=len(requests),
        prompt_tokens=sum(r.input_length for r in requests),
        hit=HitRates(
            rate(log.hit_tokens, requests), rate(lru.hit_tokens, requests), rate(infinite.hit_tokens, requests)
        ),
        lookup=Latency.of(log.times.lookup),
        load=Latency.of(log.times.load),
        store=Latency.of(log.times.store),
        bytes_loaded=log.bytes_loaded,
        bytes_stored=log.bytes_stored,
        evictions=after.evictions - before.evictions,
        lru_evictions=lru.evictions,
        used_bytes=next((t.used for t in after.tiers if t.tier is Tier.DRAM), after.used),
        peak_used_bytes=log.peak_used,
        already_stored=log.already_stored,
        lost_between=log.lost_between,
        bad_loads=log.bad_loads,
        failed_puts=log.failed_puts,
        failed_loads=log.failed_loads,
        first_error=log.first_error,
        throughput=Throughput(
            replay_s=log.wall_s,
            store_s=log.times.total_s,
            own_s=max(0.0, busy - log.times.total_s - log.stats_s),
            stats_s=log.stats_s,
            paced_sleep_s=pacer.slept_s,
            max_lag_s=pacer.max_lag_s,
            late_requests=pacer.late,
            requests_per_s=len(requests) / busy if busy > 0 else 0.0,
            calls_per_s=log.times.calls / busy if busy > 0 else 0.0,
            server_cpu_s=cpu_s,
        ),
        timeline=timeline(requests, log.hit_tokens, lru.hit_tokens, infinite.hit_tokens),
    )


def header(options: TraceOptions, requests: Sequence[Request]) -> str:
    span = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000
    pace = f"at {options.speed:g}x the trace's timestamps" if options.speed else "in trace order, as fast as answered"
    return "\n".join(
        [
            f"trace {options.file}: {len(requests)} requests over {span:.0f} s, "
            f"{sum(r.input_length for r in requests)} prompt tokens, {BLOCK_TOKENS} tokens a block; replayed {pace}",
            options.kv.describe(),
            "",
        ]
    )


def document(options: TraceOptions, requests: Sequence[Request], points: Sequence[PointResult]) -> dict[str, Any]:
    kv = options.kv
    return {
        "trace": options.file,
        "requests": len(requests),
        "prompt_tokens": sum(r.input_length for r in requests),
        "block_tokens": BLOCK_TOKENS,
        "kv": {
            "bytes_per_token": kv.bytes_per_token,
            "source": kv.source,
            "scale": kv.scale,
            "effective_scale": kv.effective_scale,
            "block_bytes": kv.block_bytes,
        },
        "speed": options.speed,
        "meta": options.meta,
        "points": [p.to_json() for p in points],
    }


def main(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    requests = read_trace(options.file, options.limit)
    text = header(options, requests)
    progress(text.strip().replace("\n", "; "))
    infinite = simulate(requests, InfiniteCache())
    points = [run_point(options, requests, c, infinite) for c in (options.capacities or (None,))]
    print(render(points, text), flush=True)
    if options.json_path:
        with open(options.json_path, "w") as fh:
            json.dump(document(options, requests, points), fh, indent=2)
    if options.png_path:
        if png.available():
            png.plot(points, text.splitlines()[0][:120], options.png_path)
            print(f"\nplots: {options.png_path}")
        else:
            print("\nno PNG: matplotlib is not installed (pip install matplotlib)")
    return 1 if any(p.bad_loads or p.failed_loads for p in points) else 0
