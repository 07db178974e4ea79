"""What metrics cost on the hot path: exists and get p50 with metrics on vs off, in the same run.

    python -m benchmarks.metrics_cost [--rounds 3] [--calls 300] [--size 4096] [--transports shm]

Two stores run side by side, one with every metric on (the service's, the daemon's on its own
port, the client's) and one with all of them off, each with a client in this process. Calls
alternate between the two in small batches, so load on a shared machine falls on both alike; each
round reports both p50s and their ratio. Rounds come in pairs that swap which store starts first
(that alone moves a p50 by several per cent here); a pair's ratio is the geometric mean of its
two, and the summary gives the min / median / max over pairs. The goal is at most 1.05.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from kvstore.bench.procs import LocalStore
from kvstore.client import KVClient
from kvstore.config import ClientConfig

BATCH = 10  # calls on one store before switching to the other


def _p50(samples: list[float]) -> float:
    return statistics.median(samples)


def _alternate(on: Callable[[], Any], off: Callable[[], Any], calls: int) -> tuple[float, float]:
    """p50 seconds of `on` and `off`, interleaved in batches (the order flips each batch)."""
    times: dict[str, list[float]] = {"on": [], "off": []}
    for batch in range(max(1, calls // BATCH)):
        order = (("on", on), ("off", off)) if batch % 2 == 0 else (("off", off), ("on", on))
        for name, call in order:
            for _ in range(BATCH):
                begun = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - begun)
    return _p50(times["on"]), _p50(times["off"])


def _round(size: int, calls: int, transports: tuple[str, ...], control: bool, on_first: bool) -> dict[str, Any]:
    """One pair of stores, started in the given order, and both ops measured on them."""
    off_env = {"KVSTORE_META_METRICS": "0"}
    on_env = off_env if control else {"KVSTORE_META_METRICS": "1", "KVSTORE_META_ADMIN_PORT": "0"}
    specs = [(() if control else ("--metrics-port", "0"), on_env, not control), ((), off_env, False)]
    if not on_first:
        specs.reverse()
    with (
        LocalStore(64 << 20, 64 << 20, specs[0][0], env=specs[0][1]) as first,
        LocalStore(64 << 20, 64 << 20, specs[1][0], env=specs[1][1]) as second,
        KVClient(first.meta_address, ClientConfig(transports=transports, metrics=specs[0][2])) as c0,
        KVClient(second.meta_address, ClientConfig(transports=transports, metrics=specs[1][2])) as c1,
    ):
        on, off = (c0, c1) if on_first else (c1, c0)
        for client in (on, off):
            client.put("bench/metrics", b"x" * size)
            for _ in range(50):  # warm connections, mappings and code paths
                client.exists("bench/metrics")
                client.get("bench/metrics")
        buf_on, buf_off = bytearray(size), bytearray(size)
        exists_on, exists_off = _alternate(
            lambda: on.exists("bench/metrics"), lambda: off.exists("bench/metrics"), calls
        )
        get_on, get_off = _alternate(
            lambda: on.get_into("bench/metrics", buf_on), lambda: off.get_into("bench/metrics", buf_off), calls
        )
    return {
        "on_first": on_first,
        "exists_p50_us": [exists_on * 1e6, exists_off * 1e6],
        "exists_ratio": exists_on / exists_off,
        "get_p50_us": [get_on * 1e6, get_off * 1e6],
        "get_ratio": get_on / get_off,
    }


def run(rounds: int, calls: int, size: int, transports: tuple[str, ...], control: bool = False) -> dict[str, Any]:
    """`rounds` pairs of rounds. The store started first measures a few per cent slower here whatever
    it runs, so each pair starts the store with metrics first once and second once, and its
    ratio is the geometric mean of the two. `control`: metrics off everywhere (the noise floor)."""
    out: dict[str, Any] = {"size": size, "transports": list(transports), "calls": calls, "rounds": [], "pairs": []}
    for _ in range(rounds):
        pair = [_round(size, calls, transports, control, on_first) for on_first in (True, False)]
        out["rounds"] += pair
        out["pairs"].append(
            {f"{op}_ratio": math.sqrt(pair[0][f"{op}_ratio"] * pair[1][f"{op}_ratio"]) for op in ("exists", "get")}
        )
    for op in ("exists", "get"):
        ratios = sorted(p[f"{op}_ratio"] for p in out["pairs"])
        out[f"{op}_ratio"] = {"min": ratios[0], "median": statistics.median(ratios), "max": ratios[-1]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.metrics_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000, help="calls per op, store and round")
    p.add_argument("--size", type=int, default=4096, help="value bytes for get")
    p.add_argument("--transports", default="shm", help="client transports, e.g. shm or tcp")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--control", action="store_true", help="metrics off on both sides: the comparison's noise floor")
    args = p.parse_args(argv)
    result = run(args.rounds, args.calls, args.size, tuple(t for t in args.transports.split(",") if t), args.control)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    side = "off (control)" if args.control else "on"
    print(f"metrics {side} vs off, {args.size}-byte values over {args.transports}, {args.calls} calls a round")
    for i, r in enumerate(result["rounds"]):
        (eon, eoff), (gon, goff) = r["exists_p50_us"], r["get_p50_us"]
        print(
            f"  round {i + 1}: exists p50 {eon:.0f} vs {eoff:.0f} us ({r['exists_ratio']:.3f}x), "
            f"get p50 {gon:.0f} vs {goff:.0f} us ({r['get_ratio']:.3f}x)"
        )
    for op in ("exists", "get"):
        q = result[f"{op}_ratio"]
        print(
            f"  {op} ratio per pair, min/median/max: {q['min']:.3f} / {q['median']:.3f} / {q['max']:.3f} (goal <= 1.05)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
