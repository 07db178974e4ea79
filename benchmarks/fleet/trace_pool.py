"""Local caches against a global pool on a Mooncake trace (FAST'25 section 5.3.2, Figure 10).

    python -m benchmarks.fleet.trace_pool TRACE --nodes 4 --capacity 3M --scale 40000 [--json F]

N prefill nodes of `--capacity` tokens each serve the trace twice, routed by the project's router
(pool_router.py): once with local caches (a node reads only its own daemon), once with the global
pool (every node reads every daemon). Printed: each run's prefix-hit rate, the global/local ratio,
the prefill tokens the pool saves, and prefill GPU time from `kvstore plan`'s model
(prefill_cost.py), beside the paper's figures. `--backend store` runs real daemons on this host
(pool_store.py), `fleet` runs them across the hosts of a fleet, a node's daemon and client on a
host of its own and the others' across the bridge, each link at `--link-mbit` (pool_fleet.py;
needs root), `sim` the exact-LRU simulators (pool_caches.py), `both` store and sim in turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.fleet.pool_caches import PoolCaches, Sharing, SimPool
from benchmarks.fleet.pool_fleet import FleetPool
from benchmarks.fleet.pool_replay import PoolRun, run_pool
from benchmarks.fleet.pool_store import StorePool
from benchmarks.fleet.prefill_cost import PrefillCost
from kvstore.bench.trace.format import Request, TraceFormatError, read_trace
from kvstore.bench.trace.sizing import KVSize, blocks_of, parse_tokens
from kvstore.engines.planner.model import PRESETS

PAPER_NODES = 10
# Figure 10 of the FAST'25 paper (10 prefill nodes of 3M tokens): global/local hit-rate ratio and
# global/local average prefill GPU time.
PAPER = {
    "conversation": (2.22, 0.76),
    "toolagent": (1.38, 0.74),
    "synthetic": (2.36, 0.52),
}


@dataclass(frozen=True)
class Comparison:
    backend: str
    local: PoolRun
    global_: PoolRun

    @property
    def hit_ratio(self) -> float:
        return self.global_.hit_rate / self.local.hit_rate if self.local.hit_rate else float("inf")

    @property
    def tokens_saved(self) -> int:
        """Prefill tokens the global pool does not compute that local caches do."""
        return self.local.computed_tokens - self.global_.computed_tokens

    @property
    def time_ratio(self) -> float:
        return self.global_.prefill_s / self.local.prefill_s if self.local.prefill_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "hit_ratio": self.hit_ratio,
            "tokens_saved": self.tokens_saved,
            "tokens_saved_share": self.tokens_saved / max(1, self.local.computed_tokens),
            "prefill_time_ratio": self.time_ratio,
            "local": self.local.to_json(),
            "global": self.global_.to_json(),
        }


def node_names(n: int) -> list[str]:
    return [f"node{i}" for i in range(n)]


def make_caches(
    backend: str, sharing: Sharing, nodes: int, capacity: int, kv: KVSize, max_blocks: int, link_mbit: float | None
) -> PoolCaches:
    names = node_names(nodes)
    if backend == "sim":
        return SimPool(sharing, names, blocks_of(capacity))
    if backend == "fleet":
        return FleetPool(sharing, names, capacity, kv, link_mbit).start(max_blocks)
    return StorePool(sharing, names, capacity, kv).start(max_blocks)


def compare(
    requests: Sequence[Request],
    backend: str,
    nodes: int,
    capacity: int,
    kv: KVSize,
    cost: PrefillCost,
    arrival_scale: float,
    cache_aware: bool = True,
    link_mbit: float | None = None,
) -> Comparison:
    runs = []
    max_blocks = max(len(r.hash_ids) for r in requests)
    for sharing in (Sharing.LOCAL, Sharing.GLOBAL):
        caches = make_caches(backend, sharing, nodes, capacity, kv, max_blocks, link_mbit)
        try:
            runs.append(run_pool(requests, caches, cost, arrival_scale, cache_aware=cache_aware))
        finally:
            caches.close()
        if isinstance(caches, StorePool | FleetPool) and (caches.bad_loads or caches.failed_puts):
            print(f"trace_pool: {sharing.value}: {caches.bad_loads} bad loads, {caches.failed_puts} failed puts "
                  f"({caches.first_error})", file=sys.stderr)  # fmt: skip
    return Comparison(backend, runs[0], runs[1])


def paper_row(trace: str) -> tuple[float, float] | None:
    return next((v for k, v in PAPER.items() if k in trace), None)


def _spread(values: Sequence[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    lo, mid, hi = min(values), statistics.median(values), max(values)
    return f"{mid:{fmt}} [{lo:{fmt}}..{hi:{fmt}}]"


_WIDTHS = (20, 20, 18, 24, 20, 20, 18)


def render(trace: str, results: Sequence[Comparison]) -> str:
    """One row per backend: median [min..max] over the repeats. Tokens saved: the prefill tokens
    local caches compute that the pool does not, as a share of local's."""
    titles = ("local hit", "global hit", "hit ratio", "tokens saved", "prefill s local", "global", "time ratio")
    head = f"{'backend':8} " + " ".join(f"{t:>{w}}" for t, w in zip(titles, _WIDTHS, strict=True))
    lines = [head]
    for backend in dict.fromkeys(c.backend for c in results):
        rs = [c for c in results if c.backend == backend]
        cells = [
            _spread([c.local.hit_rate for c in rs], ".3f"),
            _spread([c.global_.hit_rate for c in rs], ".3f"),
            _spread([c.hit_ratio for c in rs], ".2f"),
            _spread([c.tokens_saved / max(1, c.local.computed_tokens) for c in rs], ".1%"),
            _spread([c.local.mean_prefill_s for c in rs], ".3f"),
            _spread([c.global_.mean_prefill_s for c in rs], ".3f"),
            _spread([c.time_ratio for c in rs], ".2f"),
        ]
        lines.append(f"{backend:8} " + " ".join(f"{cell:>{w}}" for cell, w in zip(cells, _WIDTHS, strict=True)))
    paper = paper_row(trace)
    if paper:
        cells = ["", "", f"{paper[0]:.2f}", "", "", "", f"{paper[1]:.2f}"]
        lines.append(f"{'paper':8} " + " ".join(f"{cell:>{w}}" for cell, w in zip(cells, _WIDTHS, strict=True)))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet.trace_pool", description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a Mooncake trace (JSON lines)")
    p.add_argument("--nodes", type=int, default=4, help="prefill nodes (default: %(default)s)")
    p.add_argument("--capacity", type=parse_tokens, default=parse_tokens("3M"), help="tokens a node's cache holds")
    p.add_argument("--scale", type=float, default=40000.0, help="real KV bytes divided by this (default: %(default)g)")
    p.add_argument("--model", default="llama3-70b", choices=sorted(PRESETS), help="for KV size and prefill FLOPs")
    p.add_argument("--backend", choices=("store", "fleet", "sim", "both"), default="both")
    p.add_argument("--link-mbit", type=float, default=None, help="fleet: every node's link rate (default: unshaped)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each backend (the routing is deterministic)")
    p.add_argument(
        "--arrival-scale",
        type=float,
        default=None,
        help=f"inter-arrival times multiplied by this (default: {PAPER_NODES}/nodes, the paper's per-node load)",
    )
    p.add_argument(
        "--router",
        choices=("prefix", "load"),
        default="prefix",
        help="prefix: the router sees each node's cache (default); load: least-loaded only, a bracket",
    )
    p.add_argument("--limit", type=int, default=0, help="the trace's first N requests only")
    p.add_argument("--json", dest="json_path", help="also write the JSON (printed after the table) here")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.repeat < 1 or (args.arrival_scale is not None and args.arrival_scale <= 0):
        p.error("--nodes and --repeat must be at least 1, --arrival-scale positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        requests = read_trace(args.trace, args.limit)
    except (OSError, TraceFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kv = KVSize(PRESETS[args.model].kv_bytes_per_token, args.scale, args.model)
    cost = PrefillCost(PRESETS[args.model])
    arrival_scale = args.arrival_scale or PAPER_NODES / args.nodes
    backends = ("sim", "store") if args.backend == "both" else (args.backend,)
    started = time.perf_counter()
    results = [
        compare(
            requests, b, args.nodes, args.capacity, kv, cost, arrival_scale, args.router == "prefix", args.link_mbit
        )
        for b in backends
        for _ in range(args.repeat)
    ]
    print(
        f"trace {args.trace}: {len(requests)} requests, {sum(r.input_length for r in requests)} prompt tokens; "
        f"{args.nodes} nodes x {args.capacity} tokens; arrivals x{arrival_scale:g}; router: {args.router}\n"
        f"{kv.describe()}\n"
        f"{cost.describe()}\n"
    )
    print(render(args.trace, results))
    print(f"\n{time.perf_counter() - started:.0f} s")
    doc = {
        "trace": args.trace,
        "nodes": args.nodes,
        "capacity_tokens": args.capacity,
        "arrival_scale": arrival_scale,
        "router": args.router,
        "kv": kv.describe(),
        "cost_model": cost.describe(),
        "paper": dict(zip(("hit_ratio", "prefill_time_ratio"), paper_row(args.trace) or ())),
        "results": [c.to_json() for c in results],
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
