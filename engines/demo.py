"""`kvstore demo`: the PD-disaggregated serving path on this machine, end to end.

Starts the store, one prefill, one decode and one colocated reference engine, and one router per
scenario; drives the same workload shape (long and short prompts, shared prefixes, Poisson
arrivals) through each scenario; prints TTFT / TPOT p50 / p99 and throughput, and writes a PNG
of the distributions. Scenarios:

    colocated      every request on the colocated instance (no KV moves)
    pd             prefill instance -> kvstore -> decode instance; cached prefixes skip prefill
    pd-failures    as pd, with a share of the decode instance's KV loads failing part-way:
                   the decode instance recomputes, and every request still completes
    cost, dynamo   (optional) the router's cost model, and Dynamo's thresholds as the baseline
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field

import httpx

from kvstore.engines.launch import Fleet
from kvstore.engines.serving import iter_sse
from kvstore.engines.workload import WorkItem, WorkloadConfig, make_workload

SCENARIOS = {"colocated": "colocated", "pd": "pd", "pd-failures": "pd", "cost": "cost", "dynamo": "dynamo"}


@dataclass
class Outcome:
    ok: bool
    kind: str
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens: int = 0
    route: str = ""
    fallback: str | None = None


@dataclass
class ScenarioResult:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    def _values(self, attr: str) -> list[float]:
        return sorted(getattr(o, attr) for o in self.outcomes if o.ok and getattr(o, attr) is not None)

    def pct(self, attr: str, q: float) -> float:
        values = self._values(attr)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]

    @property
    def completed(self) -> int:
        return sum(o.ok for o in self.outcomes)

    def routes(self) -> str:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            counts[o.route] = counts.get(o.route, 0) + 1
        return " ".join(f"{k}:{v}" for k, v in sorted(counts.items()))


async def _one(http: httpx.AsyncClient, url: str, item: WorkItem) -> Outcome:
    sent = time.perf_counter()
    first = last = None
    count = 0
    try:
        async with http.stream("POST", f"{url}/v1/completions", json={
                "prompt": list(item.prompt), "max_tokens": item.max_tokens, "stream": True}) as resp:
            resp.raise_for_status()
            record = {}
            async for event in iter_sse(resp.aiter_lines()):
                if "error" in event:
                    return Outcome(False, item.kind)
                if event["choices"][0]["token_ids"]:
                    last = time.perf_counter()
                    first = first or last
                    count += len(event["choices"][0]["token_ids"])
                record = event.get("kvstore", record)
    except httpx.HTTPError:
        return Outcome(False, item.kind)
    # TTFT as the router (the front door) measured it, TPOT as the generating instance did: on 2
    # shared cores this process, juggling every stream, reads chunks late and in bursts.
    ttft = record.get("ttft_s", first - sent if first else None)
    tpot = record.get("tpot_s", (last - first) / (count - 1) if count > 1 else None)
    return Outcome(count == item.max_tokens, item.kind, ttft, tpot, count, record.get("route", "?"),
                   record.get("fallback"))


async def drive(url: str, items: list[WorkItem], label: str) -> ScenarioResult:
    """Send `items` at their arrival times; wait for all; show progress."""
    result = ScenarioResult(label)
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=10.0)) as http:
        async def fire(item: WorkItem) -> Outcome:
            await asyncio.sleep(max(0.0, item.at_s - (time.perf_counter() - start)))   # the arrival process
            out = await _one(http, url, item)
            result.outcomes.append(out)
            done = len(result.outcomes)
            line = (f"  {label:<12} {done:>3}/{len(items)} done, {sum(not o.ok for o in result.outcomes)} "
                    f"failed, {time.perf_counter() - start:5.1f}s")
            if tty:
                print("\r" + line, end="", flush=True)
            elif done % max(1, len(items) // 4) == 0 or done == len(items):
                print(line, flush=True)
            return out

        tty = sys.stdout.isatty()
        await asyncio.gather(*(fire(i) for i in items))
    result.wall_s = time.perf_counter() - start
    if tty:
        print()
    return result


def summary(results: list[ScenarioResult]) -> str:
    head = (f"{'scenario':<12} {'done':>7} {'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>8} "
            f"{'out tok/s':>9} {'req/s':>6} {'fallbacks':>9}  routes")
    rows = [head, "-" * len(head)]
    for r in results:
        out_tokens = sum(o.tokens for o in r.outcomes if o.ok)
        fallbacks = sum(1 for o in r.outcomes if o.fallback)
        rows.append(f"{r.name:<12} {r.completed:>3}/{len(r.outcomes):<3} "
                    f"{r.pct('ttft_s', .5) * 1e3:>7.0f}ms {r.pct('ttft_s', .99) * 1e3:>6.0f}ms "
                    f"{r.pct('tpot_s', .5) * 1e3:>7.1f}ms {r.pct('tpot_s', .99) * 1e3:>6.1f}ms "
                    f"{out_tokens / r.wall_s:>9.1f} {r.completed / r.wall_s:>6.2f} {fallbacks:>9}  {r.routes()}")
    return "\n".join(rows)


def plot(results: list[ScenarioResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, attr, title in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        for r in results:
            values = [v * 1e3 for v in r._values(attr)]
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                        label=f"{r.name} (p50 {r.pct(attr, .5) * 1e3:.1f} ms)")
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} (ms, log scale)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title} distribution")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("kvstore demo: reference engine, colocated vs PD through kvstore (TTFT at the router, TPOT at the instance)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = WorkloadConfig()
    p.add_argument("--requests", type=int, default=d.requests, help="requests per scenario")
    p.add_argument("--rate", type=float, default=d.rate, help="request rate (Poisson), req/s")
    p.add_argument("--output-tokens", type=int, default=d.output_tokens)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--failure-rate", type=float, default=0.5, help="share of KV loads failed in pd-failures")
    p.add_argument("--scenarios", default="colocated,pd,pd-failures",
                   help=f"comma-separated, from {', '.join(SCENARIOS)}")
    p.add_argument("--plot", default="kvstore-demo.png", help="where to write the PNG")
    p.add_argument("--dram", default="512MiB", help="store memory")
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    p.add_argument("--verbose", action="store_true", help="echo every process's output")


def run(args: argparse.Namespace) -> int:
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenarios {unknown}; choose from {list(SCENARIOS)}", file=sys.stderr)
        return 2
    cfg = WorkloadConfig(requests=args.requests, rate=args.rate, output_tokens=args.output_tokens, seed=args.seed)
    threads = ["--threads", str(args.threads)]
    results = []
    with Fleet(echo=args.verbose) as fleet:
        t0 = time.perf_counter()
        print("starting: store", end="", flush=True)
        _, meta = fleet.store(args.dram)
        print(", prefill", end="", flush=True)
        _, prefill = fleet.engine("prefill", meta, *threads)
        print(", decode", end="", flush=True)
        _, decode = fleet.engine("decode", meta, *threads)
        print(", colocated", end="", flush=True)
        _, colocated = fleet.engine("colocated", None, *threads)
        routers = {}
        for name in dict.fromkeys(SCENARIOS[n] for n in names):
            print(f", router ({name})", end="", flush=True)
            routers[name] = fleet.router([prefill], [decode], [colocated], meta, "--policy", name,
                                         "--log-level", "WARNING", name=f"router-{name}")[1]
        print(f"  [{time.perf_counter() - t0:.1f}s]")
        print(f"workload: {cfg.requests} requests at {cfg.rate} req/s, {cfg.output_tokens} output tokens; "
              f"{cfg.mix[0]:.0%} share one of {cfg.shared_prefixes} {cfg.prefix_tokens}-token prefixes, "
              f"{cfg.mix[1]:.0%} long ({cfg.long_tokens[0]}-{cfg.long_tokens[1]}), "
              f"{cfg.mix[2]:.0%} short ({cfg.short_tokens[0]}-{cfg.short_tokens[1]})")
        for salt, name in enumerate(names):
            faults = args.failure_rate if name == "pd-failures" else 0.0
            httpx.post(f"{decode}/admin/faults", json={"load_failure_rate": faults, "seed": args.seed}).raise_for_status()
            results.append(asyncio.run(drive(routers[SCENARIOS[name]], make_workload(cfg, salt), name)))
    print()
    print(summary(results))
    print("TTFT as the router measured it, TPOT as the generating instance did; out tok/s and req/s over each scenario's wall time "
          "(at a rate the instances keep up with, throughput follows the offered load)")
    plot(results, args.plot)
    print(f"\nplot: {args.plot}")
    failed = sum(len(r.outcomes) - r.completed for r in results)
    if failed:
        print(f"{failed} requests did not complete", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
