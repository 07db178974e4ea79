"""Prefix hit rate and TTFT of a shared-prefix workload through the router, with event-driven
routing (the router follows the vLLM servers' KV events and kvstore's) vs without, in one run.

    .venv/bin/python -m tests.vllm.bench_prefix_routing                      # tiny model
    .venv/bin/python -m tests.vllm.bench_prefix_routing --model small --rounds 3 --json out.json

Two colocated vLLM OpenAI servers (CPU build, kvstore's connector as kv_both unless
--no-connector) behind two routers on the same servers: `plain` (policy colocated: the
least-loaded server) and `events` (the same policy wrapped in PrefixAffinity). Each round runs
both, in alternating order, each on prefixes of its own (no cache carries over): G groups of
R requests sharing a prefix of P tokens plus a distinct suffix, sent group-interleaved by C
concurrent clients. Hit rate is vLLM's own counters (prefix_cache_hits / prefix_cache_queries,
tokens, both servers); `reused` adds what the connector loaded from kvstore (external hits).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from kvstore.engines.launch import Fleet
from tests.cluster import ADMIN_TOKEN, Cluster, found
from tests.vllm.harness import ApiServer, kv_config
from tests.vllm.test_router_vllm import metric
from tests.vllm.tiny_model import build_tiny_llama, prompt_ids

MODELS = {
    "tiny": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2},
    "small": {"layers": 4, "hidden": 512, "heads": 8, "kv_heads": 4},
}
BLOCK = 32
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:external_prefix_cache_queries_total",
    "vllm:external_prefix_cache_hits_total",
)


def counters(servers: list[ApiServer]) -> dict[str, float]:
    texts = [httpx.get(f"{s.url}/metrics", timeout=10).text for s in servers]
    return {name: sum(metric(t, name) for t in texts) for name in COUNTERS}


def one(router: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    last: dict[str, Any] | None = None
    with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=300) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{router} answered {resp.status_code}: {resp.read()[:500]!r}")
        # Split at "\n" only: httpx's iter_lines also splits at U+2028 or U+0085 inside a token's text.
        for line in "".join(resp.iter_text()).split("\n"):
            if line.startswith("data: {"):
                last = json.loads(line[6:])
    assert last is not None, f"{router} streamed no data"
    return last["kvstore"]


def phase(router: str, servers: list[ApiServer], seed: int, args: argparse.Namespace) -> dict[str, Any]:
    prefixes = [prompt_ids(args.prefix, seed + g) for g in range(args.groups)]
    prompts = [
        prefixes[g] + prompt_ids(args.suffix, seed * 7 + 1000 * g + i)
        for i in range(args.per_group)
        for g in range(args.groups)
    ]
    before = counters(servers)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        records = list(pool.map(lambda p: one(router, p, args.max_tokens), prompts))
    wall = time.perf_counter() - start
    after = counters(servers)
    d = {k: after[k] - before[k] for k in COUNTERS}
    ttft = [r["ttft_s"] for r in records]
    queries = d["vllm:prefix_cache_queries_total"]
    return {
        "hit_rate": d["vllm:prefix_cache_hits_total"] / queries if queries else 0.0,
        "reused": (d["vllm:prefix_cache_hits_total"] + d["vllm:external_prefix_cache_hits_total"]) / queries
        if queries
        else 0.0,
        "ttft_median_s": statistics.median(ttft),
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_p90_s": sorted(ttft)[int(0.9 * (len(ttft) - 1))],
        "wall_s": wall,
        "requests": len(records),
        "moved_by_affinity": sum("prefix affinity" in r["reason"] for r in records),
        "ttft_first_of_group_s": statistics.median(ttft[: args.groups]),  # cold: no one holds the prefix
        "ttft_repeats_s": statistics.median(ttft[args.groups :]),  # the prefix is cached somewhere
    }


def spread(values: list[float]) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--per-group", type=int, default=4)
    p.add_argument("--prefix", type=int, default=1024, help="shared prefix tokens")
    p.add_argument("--suffix", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-connector", action="store_true", help="plain vLLM servers (no kvstore connector)")
    p.add_argument("--dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.environ.setdefault("KVSTORE_TOKEN", ADMIN_TOKEN)  # the connectors' token for the Cluster's service

    root = Path(args.dir or tempfile.mkdtemp(prefix="kvstore-prefix-bench-"))
    model = str(build_tiny_llama(root / f"llama-{args.model}", **MODELS[args.model]))
    cluster = Cluster()
    servers: list[ApiServer] = []
    try:
        proc, meta = cluster.meta({"KVSTORE_META_EVENTS_PORT": "0", "KVSTORE_LOG_LEVEL": "INFO"})
        endpoint, replay = found(r"KV events: epoch \d+ on (\S+) \(replay (\S+)\)", "".join(proc.lines)).groups()
        cluster.daemon(meta, "2GiB")
        kv = None if args.no_connector else kv_config("kv_both", meta)
        servers = [ApiServer(n, model, kv, root, kv_cache_bytes=1 << 30, kv_events=True) for n in ("a", "b")]
        for s in servers:
            s.wait_ready(timeout=600)
        urls = [s.url for s in servers]
        with Fleet() as fleet:
            common = ["--backend", "vllm", "--policy", "colocated", "--log-level", "WARNING"]
            _, plain = fleet.router([], [], urls, None, *common, name="plain")
            events = [*common, "--kv-block-size", str(BLOCK), "--store-events", f"{endpoint},{replay}"]
            for s in servers:
                assert s.events is not None  # started with kv_events=True
                events += ["--kv-events", f"{s.url}={s.events[0]},{s.events[1]}"]
            _, evented = fleet.router([], [], urls, None, *events, name="events")
            one(plain, prompt_ids(64, 1), 1)  # warm-up: both servers, both routers
            one(evented, prompt_ids(64, 2), 1)
            results: dict[str, list[dict[str, Any]]] = {"plain": [], "events": []}
            for r in range(args.rounds):
                order = [("plain", plain), ("events", evented)]
                for name, router in order if r % 2 == 0 else order[::-1]:
                    res = phase(router, servers, seed=10_000 * (r + 1) + (0 if name == "plain" else 5000), args=args)
                    results[name].append(res)
                    print(
                        f"round {r} {name:6s}: hit rate {res['hit_rate']:.3f}, reused {res['reused']:.3f}, "
                        f"TTFT median {res['ttft_median_s'] * 1e3:.1f} ms, mean {res['ttft_mean_s'] * 1e3:.1f} ms, "
                        f"p90 {res['ttft_p90_s'] * 1e3:.1f} ms, {res['moved_by_affinity']} moved by affinity, "
                        f"wall {res['wall_s']:.1f} s",
                        flush=True,
                    )
        print(
            f"\n{args.model} model, {args.groups} groups x {args.per_group} requests, prefix {args.prefix} + "
            f"suffix {args.suffix} tokens, concurrency {args.concurrency}, "
            f"{'no connector' if args.no_connector else 'kvstore connector kv_both'}; min / median / max of "
            f"{args.rounds} rounds"
        )
        for key in ("hit_rate", "reused", "ttft_median_s", "ttft_mean_s", "ttft_first_of_group_s", "ttft_repeats_s"):
            print(
                f"  {key:21s} plain {spread([x[key] for x in results['plain']])}   "
                f"events {spread([x[key] for x in results['events']])}"
            )
        ratio = [e["ttft_median_s"] / p_["ttft_median_s"] for p_, e in zip(results["plain"], results["events"])]
        print(f"  TTFT median events/plain per round: {spread(ratio)}")
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    finally:
        for s in servers:
            s.stop()
        cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
