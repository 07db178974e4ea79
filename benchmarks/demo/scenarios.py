"""`kvstore demo`: what PD disaggregation is for, shown on this machine with the reference engine.

Starts the store and reference engines (continuous batching, chunked prefill), one router per
scenario, and drives workloads of the serving papers' shapes through each (`workload.py`):
RAG-like (long input, short output), code-like (short input, long output), chat (short both,
multi-turn), and a mix. Scenarios:

    colocated      2 colocated instances: every prompt is computed in the batch that decodes
    pd             1 prefill + 1 decode instance: prompts never share a batch with decodes
    hybrid         the PD pair plus the two colocated instances as a pool for short requests, the
                   router's cost model choosing per request (short prompts stay colocated, long
                   ones are handed off through kvstore unless that costs more than it saves);
                   with --hybrid-pool decode, the PD pair alone, short prompts computed on the
                   decode instance. Every scenario shares the machine's cores: more instances
                   are more processes, not more compute.
    pd-failures    (optional) as pd, with a share of the decode instance's KV loads failing part-way

For each run: TTFT and TPOT p50/p99 (and every inter-token gap), throughput, and goodput (requests/s
meeting both --slo-ttft and --slo-tpot); how many decode steps shared a batch with a prefill (the
interference); which route each request got and why. Then goodput against request rate on the
mixed workload, and continuous batching against one request at a time on the code-like workload.
All comparisons are ratios within this one run; the PNG shows the distributions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict
from typing import Any

import httpx

from benchmarks.demo.goodput import SLO, Summary, follow_up_hits, summarize
from benchmarks.demo.loadgen import Outcome, Run, drive
from benchmarks.demo.workload import MIXES, ShapedConfig, make_shaped
from kvstore.engines.launch import Fleet

SCENARIOS = ("colocated", "pd", "hybrid", "pd-failures")
DEFAULT_RATES = {"rag": 2.5, "code": 4.0, "chat": 8.0, "mixed": 4.0}  # req/s: loaded, not overloaded, here


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workloads", default=",".join(MIXES), help=f"comma-separated, from {', '.join(MIXES)}")
    p.add_argument("--scenarios", default="colocated,pd,hybrid", help=f"comma-separated, from {', '.join(SCENARIOS)}")
    p.add_argument("--requests", type=int, default=30, help="requests per run")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per workload, rate and scenario, the scenarios taking turns; figures pool them",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="request rate for every workload, req/s (default: "
        + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_RATES.items())
        + ")",
    )
    p.add_argument(
        "--sweep",
        default="0.5,1.5",
        help="goodput vs rate on the mixed workload: these multiples of its rate, besides 1 (empty: no sweep)",
    )
    p.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT objective, seconds")
    p.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT objective (mean per request), seconds")
    p.add_argument(
        "--serial-requests",
        type=int,
        default=32,
        help="code-like requests sent at once to one batching and one one-at-a-time instance (0: skip)",
    )
    p.add_argument(
        "--hybrid-pool",
        choices=["colocated", "decode"],
        default="colocated",
        help="where hybrid computes short prompts: the colocated instances, or the decode instance",
    )
    p.add_argument(
        "--interference-weight",
        type=float,
        default=3.0,
        help="hybrid router: a second of stalled decode stream against a second of TTFT (the TPOT "
        "objective leaves far less room than the TTFT one)",
    )
    p.add_argument("--max-batch-tokens", type=int, default=512, help="engines: tokens per step")
    p.add_argument("--failure-rate", type=float, default=0.5, help="share of KV loads failed in pd-failures")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="kvstore-demo.png", help="where to write the PNG")
    p.add_argument("--json", default=None, help="also write every run's figures here")
    p.add_argument("--dram", default="1GiB", help="store memory")
    p.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    p.add_argument("--verbose", action="store_true", help="echo every process's output")


def _names(value: str, known: Iterable[str]) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {unknown}; choose from {', '.join(known)}")
    return names


def run(args: argparse.Namespace) -> int:
    try:
        workloads, scenarios = _names(args.workloads, MIXES), _names(args.scenarios, SCENARIOS)
        sweep = [float(x) for x in args.sweep.split(",") if x.strip()]
        slo = SLO(args.slo_ttft, args.slo_tpot)
        ShapedConfig(requests=args.requests)
        if args.repeat < 1:
            raise ValueError("--repeat must be at least 1")
    except ValueError as exc:
        print(f"kvstore demo: {exc}", file=sys.stderr)
        return 2
    engine_args = [
        "--threads",
        str(args.threads),
        "--max-batch-tokens",
        str(args.max_batch_tokens),
        "--cache-blocks",
        "2048",
    ]
    runs: dict[tuple[str, str, float], Run] = {}
    with Fleet(echo=args.verbose) as fleet:
        meta, urls, routers = _deploy(fleet, args, scenarios, engine_args)
        salt = 0

        def one(workload: str, scenario: str, rate: float) -> Run:
            nonlocal salt
            salt += 1
            faults = args.failure_rate if scenario == "pd-failures" else 0.0
            httpx.post(
                f"{urls['decode']}/admin/faults", json={"load_failure_rate": faults, "seed": args.seed}
            ).raise_for_status()
            items = make_shaped(ShapedConfig(workload, args.requests, rate, args.seed), salt)
            result = asyncio.run(drive(routers[scenario], items, f"{workload}/{scenario}@{rate:g}"))
            before = runs.get((workload, scenario, rate))
            if before is not None:  # a repeat: pooled with the earlier ones
                result = Run(before.label, before.outcomes + result.outcomes, before.wall_s + result.wall_s)
            runs[(workload, scenario, rate)] = result
            return result

        rates = {w: args.rate or DEFAULT_RATES[w] for w in workloads}
        cells = [(w, rates[w]) for w in workloads]
        if "mixed" in workloads:
            cells += [("mixed", round(rates["mixed"] * factor, 3)) for factor in sweep]
        for workload, rate in cells:
            for _ in range(args.repeat):  # scenarios take turns, so load from
                for scenario in scenarios:  # elsewhere on the host hits them alike
                    one(workload, scenario, rate)
        serial = None
        if args.serial_requests:
            serial = _batching_vs_serial(fleet, meta, engine_args, urls["colocated-1"], args)
    failed = sum(len(r.outcomes) - sum(o.ok for o in r.outcomes) for r in runs.values())
    report = _report(runs, rates, workloads, scenarios, slo, serial)
    from benchmarks.demo.plot import plot

    plot(runs, rates, slo, serial, args.plot)
    print(f"\nplot: {args.plot}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if failed:
        print(f"{failed} requests did not complete", file=sys.stderr)
    return 1 if failed else 0


def _deploy(
    fleet: Fleet, args: argparse.Namespace, scenarios: list[str], engine_args: list[str]
) -> tuple[str, dict[str, str], dict[str, str]]:
    """The store, the four engine instances and a router per scenario: (meta, engines, routers)."""
    t0 = time.perf_counter()
    print("starting: store", end="", flush=True)
    _, meta = fleet.store(args.dram)
    urls = {}
    for name, role in (
        ("prefill", "prefill"),
        ("decode", "decode"),
        ("colocated-1", "colocated"),
        ("colocated-2", "colocated"),
    ):
        print(f", {name}", end="", flush=True)
        urls[name] = fleet.engine(role, meta, *engine_args, name=name)[1]
    colocated = [urls["colocated-1"], urls["colocated-2"]]
    pd = ([urls["prefill"]], [urls["decode"]])
    pools = {
        "colocated": ([], [], colocated, "colocated"),
        "pd": (*pd, [], "pd"),
        "pd-failures": (*pd, [], "pd"),
        "hybrid": (*pd, colocated if args.hybrid_pool == "colocated" else [], "cost"),
    }
    routers = {}
    for name in scenarios:
        prefill, decode, coloc, policy = pools[name]
        print(f", router ({name})", end="", flush=True)
        routers[name] = fleet.router(
            prefill,
            decode,
            coloc,
            meta,
            "--policy",
            policy,
            "--log-level",
            "WARNING",
            "--interference-weight",
            str(args.interference_weight),
            name=f"router-{name}",
        )[1]
    print(f"  [{time.perf_counter() - t0:.1f}s]")
    return meta, urls, routers


def _batching_vs_serial(
    fleet: Fleet, meta: str, engine_args: list[str], batching: str, args: argparse.Namespace
) -> tuple[Run, Run]:
    """The same burst of code-like requests to a batching instance and a one-at-a-time one."""
    print("continuous batching vs one request at a time (code-like, all sent at once):")
    _, serial = fleet.engine("colocated", meta, *engine_args, "--max-num-seqs", "1", name="one-at-a-time")
    burst = [
        item.__class__(0.0, item.kind, item.prompt, item.max_tokens)
        for item in make_shaped(ShapedConfig("code", args.serial_requests, 1.0, args.seed), 1000)
    ]
    return asyncio.run(drive(batching, burst, "batching")), asyncio.run(drive(serial, burst, "one-at-a-time"))


def _row(s: Summary) -> str:
    return (
        f"{s.label:<20} {s.completed:>3}/{s.requests:<3} {s.ttft_p50 * 1e3:>7.0f} {s.ttft_p99 * 1e3:>6.0f} "
        f"{s.tpot_p50 * 1e3:>7.1f} {s.tpot_p99 * 1e3:>6.1f} {s.itl_p99 * 1e3:>6.1f} {s.throughput:>8.1f} "
        f"{s.goodput:>6.2f} {s.attainment:>5.0%} {s.decode_steps_with_prefill:>5}/{s.decode_steps:<5} "
        f"{s.fallbacks:>3}  {' '.join(f'{k}:{v}' for k, v in sorted(s.routes.items()))}"
    )


HEAD = (
    f"{'run':<20} {'done':>7} {'TTFT p50':>7} {'p99':>6} {'TPOT p50':>7} {'p99':>6} {'ITL p99':>6} "
    f"{'out tok/s':>8} {'good/s':>6} {'SLO':>5} {'prefill-shared':>11} {'fb':>3}  routes"
)


def _report(
    runs: dict[tuple[str, str, float], Run],
    rates: dict[str, float],
    workloads: list[str],
    scenarios: list[str],
    slo: SLO,
    serial: tuple[Run, Run] | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"slo": asdict(slo), "runs": {}}
    print(
        f"\nSLO: TTFT <= {slo.ttft_s:g} s, TPOT <= {slo.tpot_s * 1e3:g} ms; times in ms; prefill-shared = decode "
        f"steps whose batch also computed prompt tokens / all decode steps\n{HEAD}\n{'-' * len(HEAD)}"
    )
    for (w, sc, rate), r in runs.items():
        s = summarize(r, slo)
        out["runs"][f"{w}/{sc}@{rate:g}"] = {**asdict(s), "goodput": s.goodput, "throughput": s.throughput}
        print(_row(s))
    for sc in scenarios:
        if ("chat", sc, rates.get("chat")) in runs:
            n, prompt, cached = follow_up_hits(runs[("chat", sc, rates["chat"])])
            if n:
                print(
                    f"chat/{sc}: {n} follow-up turns found {cached}/{prompt} prompt tokens ({cached / prompt:.0%}) "
                    f"of their history in kvstore"
                )
    if ("mixed", "hybrid", rates.get("mixed")) in runs:
        _explain_routes(runs[("mixed", "hybrid", rates["mixed"])])
    out["targets"] = _targets(runs, rates, scenarios, slo, serial)
    return out


def _explain_routes(run: Run) -> None:
    print("\nhybrid routes on the mixed workload (route/rule: requests; the cost model's mean estimates):")
    groups: dict[str, list[Outcome]] = {}
    for o in run.outcomes:
        if o.record is not None:
            groups.setdefault(f"{o.record.route}/{o.record.route_rule or '-'}", []).append(o)
    for key, outs in sorted(groups.items()):
        est = [o.record for o in outs if o.record is not None and o.record.est_transfer_s is not None]
        kinds = " ".join(f"{k}:{sum(o.kind == k for o in outs)}" for k in sorted({o.kind for o in outs}))
        line = f"  {key:<16} {len(outs):>3}  ({kinds})"
        if est:
            ms = {
                attr: sum(getattr(r, attr) for r in est) / len(est) * 1e3
                for attr in ("est_transfer_s", "est_saved_s", "est_queue_saved_s", "est_interference_saved_s")
            }
            line += (
                f"  transfer {ms['est_transfer_s']:.1f} ms vs saved {ms['est_saved_s']:.1f} ms (queue "
                f"{ms['est_queue_saved_s']:.1f}, interference {ms['est_interference_saved_s']:.1f})"
            )
        print(line)


def _targets(
    runs: dict[tuple[str, str, float], Run],
    rates: dict[str, float],
    scenarios: list[str],
    slo: SLO,
    serial: tuple[Run, Run] | None,
) -> dict[str, Any]:
    print("\ntargets (ratios within this run):")
    found: dict[str, Any] = {}
    mixed = {
        sc: summarize(runs[("mixed", sc, rates["mixed"])], slo)
        for sc in scenarios
        if ("mixed", sc, rates.get("mixed")) in runs
    }
    if {"pd", "colocated"} <= set(mixed):
        pd, co = mixed["pd"], mixed["colocated"]
        found["pd_tpot_p99_over_colocated"] = ratio = pd.tpot_p99 / co.tpot_p99
        found["pd_itl_p99_over_colocated"] = itl = pd.itl_p99 / co.itl_p99
        print(
            f"  mixed: PD TPOT p99 / colocated = {ratio:.2f} (target <= 0.5: {_yes(ratio <= 0.5)}); ITL p99 "
            f"{itl:.2f}; decode steps sharing a batch with a prefill: colocated {co.shared_share:.1%} "
            f"(~{co.prefill_tokens_per_shared_step:.0f} prompt tokens each), PD {pd.shared_share:.1%} "
            f"(~{pd.prefill_tokens_per_shared_step:.0f})"
        )
    if {"pd", "colocated", "hybrid"} <= set(mixed):
        hy = mixed["hybrid"]
        found["hybrid_goodput"] = {sc: mixed[sc].goodput for sc in ("colocated", "pd", "hybrid")}
        ok = hy.goodput >= max(mixed["pd"].goodput, mixed["colocated"].goodput)
        print(
            f"  mixed: goodput hybrid {hy.goodput:.2f} vs PD {mixed['pd'].goodput:.2f}, colocated "
            f"{mixed['colocated'].goodput:.2f} req/s (target hybrid >= both: {_yes(ok)})"
        )
        chat = {sc: summarize(runs[("mixed", sc, rates["mixed"])], slo, {"chat"}) for sc in ("pd", "hybrid")}
        found["chat_ttft_mean"] = {sc: c.ttft_mean for sc, c in chat.items()}
        print(
            f"  mixed: chat TTFT mean {chat['hybrid'].ttft_mean * 1e3:.0f} ms "
            f"(p50 {chat['hybrid'].ttft_p50 * 1e3:.0f}, "
            f"p99 {chat['hybrid'].ttft_p99 * 1e3:.0f}) under hybrid vs {chat['pd'].ttft_mean * 1e3:.0f} ms (p50 "
            f"{chat['pd'].ttft_p50 * 1e3:.0f}, p99 {chat['pd'].ttft_p99 * 1e3:.0f}) under PD (target hybrid <= PD: "
            f"{_yes(chat['hybrid'].ttft_mean <= chat['pd'].ttft_mean)})"
        )
    if serial is not None:
        batched, alone = (summarize(r, slo) for r in serial)
        found["batching_over_serial"] = speedup = batched.throughput / alone.throughput
        print(
            f"  code, burst of {batched.requests}: continuous batching {batched.throughput:.0f} out tok/s vs one at a "
            f"time {alone.throughput:.0f} = {speedup:.1f}x (target >= 3: {_yes(speedup >= 3)})"
        )
    return found


def _yes(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstore demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
