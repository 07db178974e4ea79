"""Replay a workload through a routing policy over simulated instances: policies compared on the
same requests, with no machine noise (`python -m benchmarks.router_sim`).

Instances serve one request at a time, first come first served, as the reference engine does.
A prompt costs tokens / prefill_tps, a decode step tpot_s, a KV transfer bytes / bandwidth (saves
are not overlapped with compute here: a pessimistic PD). The router's view is what the real one
has: its own count of outstanding requests and tokens per instance, and telemetry fed by finished
phases, on the simulated clock.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from benchmarks.demo.workload import WorkItem, WorkloadConfig, make_workload
from kvstore.engines.keys import KeyScheme
from kvstore.engines.router.policy import CostModel, InstanceLoad, Pools, Route, RouteRequest, make_policy
from kvstore.engines.router.telemetry import Telemetry


@dataclass(frozen=True)
class SimParams:
    prefill_tps: float = 3000.0
    tpot_s: float = 0.005
    bandwidth: float = 300e6  # bytes/s
    kv_bytes_per_token: int = 4096
    block_size: int = 16


@dataclass
class SimResult:
    policy: str
    ttft_s: list[float] = field(default_factory=list)
    routes: Counter[str] = field(default_factory=Counter)

    @property
    def mean_ttft(self) -> float:
        return statistics.fmean(self.ttft_s)

    @property
    def p99_ttft(self) -> float:
        values = sorted(self.ttft_s)
        return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]


DEFAULT_POOLS = Pools(("prefill",), ("decode",), ("colocated",), storeless=frozenset({"colocated"}))


def simulate(
    policy_name: str,
    items: list[WorkItem],
    params: SimParams = SimParams(),
    pools: Pools = DEFAULT_POOLS,
    model: CostModel | None = None,
) -> SimResult:
    model = model or CostModel(
        kv_bytes_per_token=params.kv_bytes_per_token,
        default_bandwidth=params.bandwidth,
        default_prefill_tps=params.prefill_tps,
    )
    now = 0.0
    telemetry = Telemetry(model, clock=lambda: now)
    policy = make_policy(policy_name, model, telemetry)
    scheme = KeyScheme(model="sim", layout="sim", block_size=params.block_size)
    stored: set[bytes] = set()
    free_at: dict[str, float] = {}
    load: dict[str, list[int]] = {}
    result = SimResult(policy_name)
    events: list[tuple[float, int, str, tuple[Any, ...]]] = []
    seq = itertools.count()

    def at(t: float, kind: str, *args: object) -> None:
        heapq.heappush(events, (t, next(seq), kind, args))

    def link(tokens: int) -> float:
        return tokens * params.kv_bytes_per_token / params.bandwidth

    def track(inst: str, requests: int, tokens: int) -> None:
        entry = load.setdefault(inst, [0, 0])
        entry[0] += requests
        entry[1] += tokens

    def run_on(inst: str, load_s: float, compute: int, out_tokens: int) -> tuple[float, float, float]:
        """Queue a job on `inst` now: (prompt done, first token, end) times."""
        start = max(now, free_at.get(inst, 0.0))
        prompt_done = start + load_s + compute / params.prefill_tps
        end = prompt_done + max(0, out_tokens - 1) * params.tpot_s
        free_at[inst] = end
        return prompt_done, prompt_done, end

    def generate(item: WorkItem, inst: str, cached: int, storeless: bool, arrival: float) -> None:
        cached = 0 if storeless else cached
        compute = len(item.prompt) - cached
        track(inst, 1, compute)
        done, first, end = run_on(inst, link(cached), compute, item.max_tokens)
        result.ttft_s.append(first - arrival)
        if cached:
            at(done, "transfer", cached, link(cached))
        at(done, "computed", inst, compute)
        at(end, "finished", inst)

    for item in items:
        at(item.at_s, "arrive", item)
    while events:
        now, _, kind, args = heapq.heappop(events)
        if kind == "arrive":
            (item,) = args
            hashes = scheme.block_hashes(item.prompt)
            cached = next((i for i, h in enumerate(hashes) if h not in stored), len(hashes)) * params.block_size
            loads = {u: InstanceLoad(r, t) for u, (r, t) in load.items()}
            decision = policy.decide(RouteRequest(len(item.prompt), cached), pools, loads)
            result.routes[decision.route.value] += 1
            telemetry.record_arrival(decision.prefill or decision.target)
            if decision.route is Route.PD:
                prefill = decision.prefill
                assert prefill is not None, "a PD decision names its prefill instance"
                u = len(item.prompt) - cached
                track(prefill, 1, u)
                done, _, _ = run_on(prefill, link(cached), u, 1)
                done += link(u)  # the save
                at(done, "prefilled", item, prefill, decision.target, u, hashes, now)
            else:
                generate(item, decision.target, cached, decision.target in pools.storeless, now)
        elif kind == "prefilled":
            item, prefill, target, u, hashes, arrival = args
            track(prefill, -1, -u)
            telemetry.record_prefill(u, u / params.prefill_tps)
            stored.update(hashes)
            full = len(hashes) * params.block_size
            usable = min(full, (len(item.prompt) - 1) // params.block_size * params.block_size)
            generate(item, target, usable, False, arrival)
        elif kind == "transfer":
            tokens, seconds = args
            telemetry.record_transfer(tokens * params.kv_bytes_per_token, seconds)
        elif kind == "computed":
            inst, tokens = args
            track(inst, 0, -tokens)
        elif kind == "finished":
            track(args[0], -1, 0)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.router_sim", description=__doc__)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--rates", default="0.5,1,1.5,2,3", help="request rates to try, req/s")
    p.add_argument("--bandwidth", type=float, default=SimParams.bandwidth, help="bytes/s")
    p.add_argument("--prefill-tps", type=float, default=SimParams.prefill_tps)
    p.add_argument("--policies", default="colocated,pd,dynamo,cost")
    args = p.parse_args(argv)
    params = SimParams(prefill_tps=args.prefill_tps, bandwidth=args.bandwidth)
    names = args.policies.split(",")
    print(f"{'rate':>5}  " + "  ".join(f"{n + ' mean/p99 TTFT':>26}" for n in names))
    for rate in (float(r) for r in args.rates.split(",")):
        items = make_workload(WorkloadConfig(requests=args.requests, rate=rate))
        cells = []
        for name in names:
            r = simulate(name, items, params)
            cells.append(f"{r.mean_ttft * 1e3:>10.0f} / {r.p99_ttft * 1e3:>7.0f} ms")
        print(f"{rate:>5g}  " + "  ".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
