"""A client on a fleet host (`python -m tests.fleet.replica_reader --meta ...`) that reads a
two-replica key and says where its bytes came from: it puts one key of --mib MiB with two
replicas (the put itself measures both links), finds a one-replica key on the daemon at --fast
(the rate of that link alone, for comparison), then reads the two keys in turn --rounds times and
prints one JSON line `replicas: {...}`: get bytes per daemon address, each read's rate, and the
link monitor's bandwidth per daemon address. The token comes from $KVSTORE_TOKEN."""

from __future__ import annotations

import argparse
import json
import statistics
import time

from kvstore.client import KVClient
from kvstore.config import ClientConfig


def _address(client: KVClient, daemon: str) -> str:
    assert client.metrics is not None
    endpoint = client.metrics.seen[daemon].endpoint("tcp")
    return "" if endpoint is None else endpoint.address.rsplit(":", 1)[0]


def _bytes_by_address(client: KVClient, direction: str) -> dict[str, int]:
    assert client.metrics is not None
    out: dict[str, int] = {}
    for (_, daemon, way), (_, nbytes, _) in client.metrics.totals().items():
        if way == direction:
            out[_address(client, daemon)] = out.get(_address(client, daemon), 0) + nbytes
    return out


def _rate(client: KVClient, key: str, size: int) -> float:
    begun = time.perf_counter()
    value = client.get(key)
    seconds = time.perf_counter() - begun
    assert len(value) == size
    return size / seconds


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.fleet.replica_reader")
    p.add_argument("--meta", required=True)
    p.add_argument("--fast", required=True, help="the address of the daemon behind the faster link")
    p.add_argument("--mib", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    size = int(args.mib * (1 << 20))
    value = bytes(range(256)) * (size // 256)
    with KVClient(args.meta, ClientConfig(replica_num=2, transports=("tcp",))) as two, \
         KVClient(args.meta, ClientConfig(transports=("tcp",))) as one:  # fmt: skip
        two.put("replicas/two", value)
        for n in range(16):  # a one-replica key on the fast daemon, for that link's own rate
            before = _bytes_by_address(one, "put").get(args.fast, 0)
            one.put(f"replicas/one/{n}", value)
            if _bytes_by_address(one, "put").get(args.fast, 0) > before:
                single = f"replicas/one/{n}"
                break
        else:
            raise SystemExit(f"no one-replica put landed on {args.fast} in 16 tries")
        gets_before = _bytes_by_address(two, "get")
        rates_two, rates_one = [], []
        for _ in range(args.rounds):
            rates_two.append(_rate(two, "replicas/two", size))
            rates_one.append(_rate(one, single, size))
        gets = {a: n - gets_before.get(a, 0) for a, n in _bytes_by_address(two, "get").items()}
        bandwidth = {_address(two, link.daemon): link.bandwidth_bytes_per_s for link in two.links()}
        report = {
            "get_bytes": gets,
            "two_replica_rates": rates_two,
            "fast_link_rates": rates_one,
            "ratio": statistics.median(rates_two) / statistics.median(rates_one),
            "bandwidth": bandwidth,
        }
        print("replicas: " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
