"""What authentication and TLS cost: exists and get p50, and 1 MiB / 16 MiB get throughput, with
authentication on, with TLS on the control plane (gRPC and the fast lane), and with TLS on the
data plane too (the tls transport), each as a ratio to the same measurements with
authentication off, on this machine, in the same run.

    python -m benchmarks.security_cost [--rounds 3] [--calls 1000] [--json]

Four stores run side by side (auth off; auth on; auth + TLS control plane; auth + TLS on both
planes), each with a client in this process over tcp (tls for the last). Calls go to the four
in turn (batches of 10 for the latencies, one read each for throughput, the order rotating), so
load on a shared machine falls on each alike; values are distinct bytes per key. The summary is
min / median / max over rounds of each configuration's ratio to the auth-off store of that round.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import secrets
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvstore.bench.procs import LocalStore
from kvstore.client import KVClient
from kvstore.config import ClientConfig

MIB = 1 << 20
SMALL = 4096
CONFIGS = ("plain", "auth", "auth+tls-control", "auth+tls-both")
METRICS = ("exists_p50_us", "get_p50_us", "get_1MiB_GBps", "get_16MiB_GBps")


def _certificate(d: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made by openssl: (cert, key)."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "key.pem", "-out", "cert.pem", "-days", "1", "-subj", "/CN=kvstore-bench",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        cwd=d, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(d / "cert.pem"), str(d / "key.pem")


def _stores(cert: str, key: str, token: str) -> dict[str, tuple[LocalStore, ClientConfig]]:
    off = {"KVSTORE_META_AUTH": "false", "KVSTORE_META_METRICS": "0"}
    on = {"KVSTORE_TOKEN": token, "KVSTORE_META_METRICS": "0"}
    tls_meta = {**on, "KVSTORE_META_TLS_CERT": cert, "KVSTORE_META_TLS_KEY": key, "KVSTORE_DAEMON_TLS_CA": cert}
    tls_both = {**tls_meta, "KVSTORE_DAEMON_TLS_CERT": cert, "KVSTORE_DAEMON_TLS_KEY": key}
    tcp = ("--transports", "tcp")
    client = ClientConfig(transports=("tcp",), token=token, metrics=False)
    return {
        "plain": (LocalStore(512 * MIB, 256 * MIB, tcp, env=off), client),
        "auth": (LocalStore(512 * MIB, 256 * MIB, tcp, env=on), client),
        "auth+tls-control": (
            LocalStore(512 * MIB, 256 * MIB, tcp, env=tls_meta),
            ClientConfig(transports=("tcp",), token=token, tls_ca=cert, metrics=False),
        ),
        "auth+tls-both": (
            LocalStore(512 * MIB, 256 * MIB, ("--transports", "tls"), env=tls_both),
            ClientConfig(transports=("tls",), token=token, tls_ca=cert, metrics=False),
        ),
    }


BATCH = 10  # calls on one store before the next store's turn


def _interleaved_p50_us(calls: Mapping[str, Callable[[], Any]], n: int, turn: int) -> dict[str, float]:
    """p50 microseconds of each store's call, the stores taking turns in batches of BATCH (the
    order rotating every batch), so a burst of load on the machine falls on all alike."""
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for batch in range(max(1, n // BATCH)):
        k = (batch + turn) % len(names)
        for name in names[k:] + names[:k]:
            call = calls[name]
            for _ in range(BATCH):
                begun = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - begun)
    return {name: statistics.median(v) * 1e6 for name, v in samples.items()}


def _interleaved_gbps(
    clients: dict[str, KVClient], keys: dict[str, list[str]], size: int, turn: int
) -> dict[str, float]:
    """GB/s of get_into for each store, reading one key of each store in turn."""
    buf = bytearray(size)
    spent = dict.fromkeys(clients, 0.0)
    names = list(clients)
    for i in range(len(next(iter(keys.values())))):
        k = (i + turn) % len(names)
        for name in names[k:] + names[:k]:
            begun = time.perf_counter()
            clients[name].get_into(keys[name][i], buf)
            spent[name] += time.perf_counter() - begun
    return {name: len(keys[name]) * size / spent[name] / 1e9 for name in names}


def _round(clients: dict[str, KVClient], r: int, calls: int) -> dict[str, dict[str, float]]:
    small = {name: f"sec/{r}/{name}/small" for name in clients}
    big1 = {name: [f"sec/{r}/{name}/1m/{i}" for i in range(32)] for name in clients}
    big16 = {name: [f"sec/{r}/{name}/16m/{i}" for i in range(4)] for name in clients}
    buf = bytearray(SMALL)
    for name, client in clients.items():  # distinct bytes per key
        client.put_many(big1[name], [os.urandom(MIB) for _ in big1[name]])
        for key in big16[name]:
            client.put(key, os.urandom(16 * MIB))
        client.put(small[name], os.urandom(SMALL))
        for _ in range(50):  # warm connections and code paths
            client.exists_many([small[name]])
            client.get_into(small[name], buf)
    probes = {n: functools.partial(c.exists_many, [small[n]]) for n, c in clients.items()}
    exists = _interleaved_p50_us(probes, calls, r)
    reads = {n: functools.partial(c.get_into, small[n], buf) for n, c in clients.items()}
    get = _interleaved_p50_us(reads, calls, r)
    one = _interleaved_gbps(clients, big1, MIB, r)
    sixteen = _interleaved_gbps(clients, big16, 16 * MIB, r)
    for name, client in clients.items():
        client.remove_many([small[name], *big1[name], *big16[name]], force=True)  # its reads' leases would keep them
    return {
        name: {"exists_p50_us": exists[name], "get_p50_us": get[name], "get_1MiB_GBps": one[name],
               "get_16MiB_GBps": sixteen[name]}
        for name in clients
    }  # fmt: skip


def run(rounds: int, calls: int) -> dict[str, Any]:
    token = "kvsa_bench_" + secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-tls-") as d:
        cert, key = _certificate(Path(d))
        stores = _stores(cert, key, token)
        for store, _ in stores.values():
            store.start()
        try:
            clients = {name: KVClient(s.meta_address, cfg) for name, (s, cfg) in stores.items()}
            per_round = [_round(clients, r, calls) for r in range(rounds)]
            for client in clients.values():
                client.close()
        finally:
            for store, _ in stores.values():
                store.close()
    summary: dict[str, Any] = {}
    for name in CONFIGS[1:]:
        summary[name] = {}
        for metric in METRICS:
            ratios = sorted(r[name][metric] / r["plain"][metric] for r in per_round)
            summary[name][metric] = {"min": ratios[0], "median": statistics.median(ratios), "max": ratios[-1]}
    return {"calls": calls, "rounds": per_round, "ratio_to_plain": summary}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.security_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=1000, help="exists and get calls per store and round")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = run(args.rounds, args.calls)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"authentication and TLS vs auth off, tcp (tls for the data plane), {args.calls} calls, {args.rounds} rounds")
    for i, r in enumerate(result["rounds"]):
        cells = [
            f"{name} exists {m['exists_p50_us']:.0f} us, get {m['get_p50_us']:.0f} us, "
            f"1 MiB {m['get_1MiB_GBps']:.2f} GB/s, 16 MiB {m['get_16MiB_GBps']:.2f} GB/s"
            for name, m in r.items()
        ]
        print(f"  round {i + 1}: " + "; ".join(cells))
    print("ratio to auth off, min / median / max over rounds (latency: higher is slower; GB/s: lower is slower)")
    for name, metrics in result["ratio_to_plain"].items():
        ratios = [f"{metric} {q['min']:.3f} / {q['median']:.3f} / {q['max']:.3f}" for metric, q in metrics.items()]
        print(f"  {name}: {', '.join(ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
