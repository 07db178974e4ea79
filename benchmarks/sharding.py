"""How the metadata service scales with shards: service CPU per call, aggregate calls/s, and
what a 32-key match_prefix costs an engine, for each shard count, in one run.

    python -m benchmarks.sharding [--shards 1,2,4] [--rounds 3] [--clients 4] [--seconds 3] [--json]

For each S a store is started as `kvstore serve --shards S` (shards 1..S-1 are processes of their
own; shard 0 and the daemon share the serving process) and filled with hashed keys and with
tagged 32-key chains; all of them run at once. Then, per round, each store in turn (the order
rotating):
- CPU per call: one client makes N calls of each kind (Exists of 1 key — of any shard, and of
  shard 0's keys only, which keeps one shard process busy as a loaded one is; MatchPrefix of a 32-key
  chain tagged to one shard and of an untagged one that fans out, Get of 1 key, a 4 KiB put =
  PutStart + PutEnd); the service processes' CPU time (every thread's schedstat, every shard)
  over the calls, less what they burn idle over the same time (measured just before), is the
  cost per call. Flat across S means the shards add and do not contend.
- Aggregate calls/s: `--clients` processes call Exists (and MatchPrefix(32), tagged) as fast as
  they can for `--seconds`; the machine's busy % over the same window is printed beside it, since
  clients and shards share this machine's cores.
- match_prefix p50 of a 32-key chain from one client: tagged (one call) and fanned out.
Summaries are min / median / max over rounds; ratios are to S = 1 of the same run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstore.bench.procs import ServerProcess
from kvstore.client import KVClient
from kvstore.config import random_secret
from kvstore.shards import shard_of

_KEYS = 2000
_CHAINS = 64


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(p) for p in text)
    return found


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds the processes' threads have run (schedstat: nanoseconds, not clock ticks)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended meanwhile
    return total / 1e9


def _busy() -> tuple[int, int]:
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return sum(parts) - idle, sum(parts)


def _tagged(c: int) -> list[str]:
    return [f"bench/m/{{chain{c}}}/{i:04x}" for i in range(32)]


def _untagged(c: int) -> list[str]:
    return [f"bench/m/chain{c}/{i:04x}" for i in range(32)]


def _hammer(address: str, kind: str, seconds: float, out: Any) -> None:
    keys = [f"bench/k/{i}" for i in range(_KEYS)]
    with KVClient(address) as client:
        client.exists_many(keys[:1])  # connect (and find the shards) before the clock starts
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            for i in range(50):
                if kind == "exists":
                    client.exists_many([keys[(n + i) % _KEYS]])
                else:
                    client.match_prefix(_tagged((n + i) % _CHAINS))
            n += 50
        out.put(n)


class Store:
    def __init__(self, shards: int) -> None:
        env = dict(os.environ, KVSTORE_SECRET=random_secret(), PYTHONUNBUFFERED="1")
        self.proc = ServerProcess(
            ["serve", "--port", "0", "--dram", "512MiB", "--ssd-dir", "", "--shards", str(shards)], env
        )
        self.address = self.proc.wait_ready(120)
        self.pids = [self.proc.pid, *(p for p in _children(self.proc.pid) if _is_shard(p))]
        self.shards = shards

    def idle_cpu_rate(self, window_s: float = 0.5) -> float:
        """CPU seconds per second the service processes use with no calls (tickers, heartbeats)."""
        before = _cpu_s(self.pids)
        time.sleep(window_s)  # measuring an idle window: nothing to wait for
        return (_cpu_s(self.pids) - before) / window_s

    def cpu_per_call_us(self, calls: int, call: Callable[[int], object], idle_rate: float) -> float:
        """The calls' service CPU, less what the processes burn idle over the same time."""
        before, started = _cpu_s(self.pids), time.monotonic()
        for i in range(calls):
            call(i)
        used = _cpu_s(self.pids) - before - idle_rate * (time.monotonic() - started)
        return max(0.0, used) / calls * 1e6

    def stop(self) -> None:
        self.proc.stop()


def _is_shard(pid: int) -> bool:
    try:
        return b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _fill(client: KVClient) -> None:
    keys = [f"bench/k/{i}" for i in range(_KEYS)]
    for start in range(0, _KEYS, 250):
        part = keys[start : start + 250]
        client.put_many(part, [os.urandom(512) for _ in part])
    for c in range(_CHAINS):
        for chain in (_tagged(c), _untagged(c)):
            client.put_many(chain, [os.urandom(256) for _ in chain])


def _p50_us(call: Callable[[int], object], n: int) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _kinds(client: KVClient, shards: int) -> dict[str, Callable[[int], object]]:
    keys = [f"bench/k/{i}" for i in range(_KEYS)]
    first = [k for k in keys if shard_of(k, shards) == 0]  # a load that keeps one shard busy
    return {
        "exists": lambda i: client.exists_many([keys[i % _KEYS]]),
        "exists_one_shard": lambda i: client.exists_many([first[i % len(first)]]),
        "match_prefix32_tagged": lambda i: client.match_prefix(_tagged(i % _CHAINS)),
        "match_prefix32_fanout": lambda i: client.match_prefix(_untagged(i % _CHAINS)),
        "get": lambda i: client.get_many([keys[i % _KEYS]]),
        "put": lambda i: client.put_many([f"bench/p/{shards}/{time.monotonic_ns()}/{i}"], [os.urandom(4096)]),
    }


def measure(
    counts: list[int], rounds: int, clients: int, seconds: float, calls: int
) -> dict[int, dict[str, list[float]]]:
    """Every shard count's store runs at once; each round measures them in turn (the order
    rotating), so load on a shared machine falls on each alike."""
    stores: dict[int, Store] = {}
    out: dict[int, dict[str, list[float]]] = {s: {} for s in counts}
    try:
        for s in counts:
            print(f"sharding bench: starting and filling S={s}", flush=True)
            stores[s] = Store(s)
        kv = {s: KVClient(stores[s].address) for s in counts}
        for s in counts:
            _fill(kv[s])
        for r in range(rounds):
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            print(f"  round {r + 1}/{rounds}: S in the order {order}", flush=True)
            for s in order:
                store, res, kinds = stores[s], out[s], _kinds(kv[s], s)
                idle = store.idle_cpu_rate()
                res.setdefault("idle_cpu_pct", []).append(100 * idle)
                for name, call in kinds.items():
                    res.setdefault(f"cpu_us_{name}", []).append(store.cpu_per_call_us(calls, call, idle))
                for name in ("match_prefix32_tagged", "match_prefix32_fanout"):
                    res.setdefault(f"p50_us_{name}", []).append(_p50_us(kinds[name], calls))
                for kind in ("exists", "match_prefix32"):
                    rate, busy = _aggregate(store.address, kind, clients, seconds)
                    res.setdefault(f"calls_per_s_{kind}", []).append(rate)
                    res.setdefault(f"busy_pct_{kind}", []).append(busy)
        for client in kv.values():
            client.close()
    finally:
        for store in stores.values():
            store.stop()
    return out


def _aggregate(address: str, kind: str, clients: int, seconds: float) -> tuple[float, float]:
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(address, kind, seconds, results)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(min(1.0, seconds / 3))  # the clients connect and start (counted from their own start)
    busy0, total0 = _busy()
    counts = [results.get(timeout=seconds + 120) for _ in procs]
    busy1, total1 = _busy()
    for p in procs:
        p.join(30)
    return sum(counts) / seconds, 100 * (busy1 - busy0) / max(1, total1 - total0)


def _summary(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--shards", default="1,2,4", help="shard counts, comma-separated (default 1,2,4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4, help="client processes for the aggregate rate")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long each aggregate run lasts")
    parser.add_argument("--calls", type=int, default=500, help="calls per kind for CPU per call and p50")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(s) for s in re.split(r"[,\s]+", args.shards) if s]
    results = measure(counts, args.rounds, args.clients, args.seconds, args.calls)
    if args.json:
        print(json.dumps({str(s): r for s, r in results.items()}, indent=2))
        return 0
    base = results[counts[0]]
    print(f"\nmin / median / max over {args.rounds} rounds; ratios: median to S={counts[0]} of this run")
    print(f"machine: {os.cpu_count()} cores shared by the shards and {args.clients} client processes")
    for metric in base:
        print(f"{metric}:")
        for s in counts:
            values = results[s][metric]
            first = statistics.median(base[metric])
            ratio = statistics.median(values) / first if first else 0.0
            print(f"  S={s}: {_summary(values)}  (x{ratio:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
