"""The policy study: every candidate of policies.py, the exact LRU and Belady's offline policy on
traces at capacities in tokens, as hit rate, ÷ the infinite bound and ÷ the LRU.

    python -m kvstore.bench.trace.study TRACE.jsonl [TRACE.jsonl ...] [--capacity 1M,3M,10M]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kvstore.bench.trace.arcsim import PrefixARC, StoreARC
from kvstore.bench.trace.belady import belady
from kvstore.bench.trace.format import Request, read_trace
from kvstore.bench.trace.policies import S3FIFO, PrefixLRU, ProbationLRU, Sieve, TinyLFU
from kvstore.bench.trace.sim import InfiniteCache, LRUCache, PrefixCache, SimResult, simulate
from kvstore.bench.trace.sizing import blocks_of, parse_tokens

CANDIDATES: dict[str, Callable[[int], PrefixCache]] = {
    "lru": LRUCache,
    "arc": StoreARC,
    "prefix-arc": PrefixARC,
    "prefix-lru": PrefixLRU,
    "probation-lru": ProbationLRU,
    "s3fifo": S3FIFO,
    "sieve": Sieve,
    "tinylfu": TinyLFU,
}


def hit_rate(requests: Sequence[Request], result: SimResult) -> float:
    return result.total_hit_tokens / max(1, sum(r.input_length for r in requests))


def study(requests: Sequence[Request], tokens: int, names: Sequence[str]) -> dict[str, float]:
    """Hit rate per policy (and "belady", "infinite") at `tokens` of capacity."""
    blocks = blocks_of(tokens)
    out = {name: hit_rate(requests, simulate(requests, CANDIDATES[name](blocks))) for name in names}
    out["belady"] = hit_rate(requests, belady(requests, blocks))
    out["infinite"] = hit_rate(requests, simulate(requests, InfiniteCache()))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvstore.bench.trace.study")
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--capacity", default="1M,3M,10M")
    parser.add_argument("--policies", default=",".join(CANDIDATES))
    args = parser.parse_args(argv)
    names = args.policies.split(",")
    print("| trace | capacity | policy | hit rate | ÷ infinite | ÷ LRU | sim s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in args.traces:
        requests = read_trace(path)
        trace = Path(path).name.removesuffix(".jsonl").removesuffix("_trace")
        for text in args.capacity.split(","):
            t0 = time.perf_counter()
            rates = study(requests, parse_tokens(text), names)
            took = time.perf_counter() - t0
            for name, rate in rates.items():
                lru = rates.get("lru", rate)
                print(
                    f"| {trace} | {text} | {name} | {100 * rate:.1f} % "
                    f"| {rate / rates['infinite']:.3f} | {rate / lru if lru else 0:.3f} | {took:.0f} |"
                )


if __name__ == "__main__":
    main()
