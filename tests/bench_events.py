"""What KV events cost the metadata service: events/s published under the bench's put load, the
service's CPU per put with events on vs off, and how far events lag the puts. Same run, real
processes, alternating order.

    .venv/bin/python -m tests.bench_events --runs 3 [--size 4KiB] [--json out.json]

Per run and mode: `kvstore meta` (KVSTORE_META_EVENTS_PORT=0 or off) and one `kvstore daemon`;
a subscriber (kvstore.events.subscriber, in this process) counts what is published. Loads:
    bench   kvstore bench's throughput phases (kvstore.bench.store: single put/get, batched
            put_many/get_many_into, then remove), with a fixed op count instead of its time cap
    puts    put_many only, 256 keys a call: the metadata service's hottest write path
Service CPU is utime+stime of the meta process (/proc) across each load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from kvstore.bench.context import ClientTarget
from kvstore.bench.store import SourcePool, ThroughputPlan, measure_batched, measure_single
from kvstore.client import KVClient
from kvstore.config import ClientConfig, parse_size
from kvstore.events import wire
from kvstore.events.block_ids import block_ref
from kvstore.events.subscriber import EventSubscriber
from tests.cluster import ADMIN_TOKEN, Cluster, found, wait_until

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


class Counter:
    def __init__(self) -> None:
        self.events = 0
        self.batches = 0
        self.seen: dict[int, float] = {}  # block hash -> when it arrived (for lag)
        self.watch: set[int] = set()
        self.lock = threading.Lock()

    def batch(self, seq: int, batch: wire.Batch) -> None:
        now = time.perf_counter()
        with self.lock:
            self.batches += 1
            self.events += len(batch.events)
            for e in batch.events:
                if isinstance(e, wire.Stored) and e.hashes[0] in self.watch:
                    self.seen[e.hashes[0]] = now

    def lost(self) -> None:
        pass


def one_run(events: bool, size: int, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    cluster = Cluster()
    env = {"KVSTORE_LOG_LEVEL": "INFO"} | ({"KVSTORE_META_EVENTS_PORT": "0"} if events else {})
    counter, sub = Counter(), None
    try:
        proc, meta = cluster.meta(env)
        cluster.daemon(meta, "1GiB")
        if events and not args.no_subscriber:
            endpoint, replay = found(r"KV events: epoch \d+ on (\S+) \(replay (\S+)\)", "".join(proc.lines)).groups()
            sub = EventSubscriber(endpoint, counter, replay).start()
        out: dict[str, Any] = {"events": events}
        with KVClient(meta, ClientConfig(transports=("shm", "tcp"))) as client:
            if sub is not None:
                n = 0

                def joined() -> bool:
                    nonlocal n
                    client.put(f"{tag}/join/{n}", b"x")
                    n += 1
                    return counter.events > 0

                wait_until(joined, what="the subscriber to join")
            target, pool = ClientTarget(client), SourcePool(2 * args.ops * size)
            plan = ThroughputPlan(
                phase_bytes=args.ops * size, max_single_ops=args.ops // 8, max_rounds=64, time_cap_s=600.0
            )
            for load in ("bench", "puts"):
                cpu0, ev0, t0 = cpu_s(proc.pid), counter.events, time.perf_counter()
                if load == "bench":
                    results = measure_single(target, target, "shm", size, plan, f"{tag}/s", pool) + measure_batched(
                        target, target, "shm", size, plan, f"{tag}/b", pool
                    )
                    puts = sum(r.ops for r in results if r.op == "put")
                else:
                    keys = [f"{tag}/p/{i}" for i in range(args.ops)]
                    for i in range(0, len(keys), 256):  # distinct bytes per key
                        client.put_many(
                            keys[i : i + 256], [pool.value(j, size) for j in range(i, min(i + 256, len(keys)))]
                        )
                    puts = len(keys)
                wall = time.perf_counter() - t0
                if sub is not None:  # the load's last events, published within milliseconds
                    wait_until(lambda ev0=ev0, puts=puts: counter.events - ev0 >= puts, what="the load's events")
                cpu = cpu_s(proc.pid) - cpu0
                out[load] = {
                    "puts": puts,
                    "wall_s": wall,
                    "service_cpu_s": cpu,
                    "cpu_us_per_put": cpu / puts * 1e6,
                    "events": counter.events - ev0,
                    "events_per_s": (counter.events - ev0) / wall,
                }
            if sub is not None:
                lags = []
                for i in range(args.lag_samples):
                    key = f"{tag}/lag/{i}"
                    h = block_ref(key).hash
                    with counter.lock:
                        counter.watch.add(h)
                    t0 = time.perf_counter()
                    client.put(key, b"l" * size)
                    wait_until(lambda h=h: h in counter.seen, what="a lag sample")
                    lags.append(counter.seen[h] - t0)
                out["lag_ms"] = {"median": statistics.median(lags) * 1e3, "max": max(lags) * 1e3}
        return out
    finally:
        if sub is not None:
            sub.stop()
        cluster.close()


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return " / ".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--size", default="4KiB")
    p.add_argument("--ops", type=int, default=8192, help="puts per load")
    p.add_argument("--lag-samples", type=int, default=50)
    p.add_argument("--no-subscriber", action="store_true", help="publish to nobody (isolates ZMQ's sending)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.environ.setdefault("KVSTORE_TOKEN", ADMIN_TOKEN)  # the operator's token the Cluster's services take
    size = parse_size(args.size)
    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for r in range(args.runs):
        modes = [False, True] if r % 2 == 0 else [True, False]
        got = {m: one_run(m, size, args, f"r{r}-{int(m)}") for m in modes}
        runs.append((got[False], got[True]))
        for load in ("bench", "puts"):
            off, on = got[False][load], got[True][load]
            print(
                f"run {r} {load:5s}: off {off['cpu_us_per_put']:.1f} us/put ({off['puts'] / off['wall_s']:.0f} puts/s)"
                f"  on {on['cpu_us_per_put']:.1f} us/put ({on['puts'] / on['wall_s']:.0f} puts/s, "
                f"{on['events_per_s']:.0f} events/s)  extra {on['cpu_us_per_put'] / off['cpu_us_per_put'] - 1:+.1%}",
                flush=True,
            )
        if "lag_ms" in got[True]:
            print(
                f"run {r} lag: median {got[True]['lag_ms']['median']:.2f} ms, max {got[True]['lag_ms']['max']:.2f} ms"
            )
    print(f"\n{args.size} values, {args.ops} puts a load, {args.runs} runs (min / median / max)")
    for load in ("bench", "puts"):
        off = [o[load]["cpu_us_per_put"] for o, _ in runs]
        on = [n[load]["cpu_us_per_put"] for _, n in runs]
        extra = [n / o - 1 for o, n in zip(off, on)]
        print(
            f"  {load}: service CPU per put off {spread(off)} us, on {spread(on)} us, extra "
            f"{spread([e * 100 for e in extra])} %; "
            f"events/s {spread([n[load]['events_per_s'] for _, n in runs], '{:.0f}')}"
        )
    if all("lag_ms" in n for _, n in runs):
        print(f"  lag median {spread([n['lag_ms']['median'] for _, n in runs], '{:.2f}')} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
