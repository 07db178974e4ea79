"""Client work run in separate processes by the integration tests: python -m tests.workers CMD ..."""

from __future__ import annotations

import json
import random
import sys

import numpy as np

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KeyBusy, KeyNotFound


def mixed_sizes(n: int, seed: int) -> list[int]:
    """Log-uniform sizes from 1 B to 8 MiB."""
    rng = random.Random(seed)
    return [max(1, min(8 << 20, int(2 ** rng.uniform(0, 23)))) for _ in range(n)]


def block(seed: int, i: int, size: int) -> bytes:
    return np.random.default_rng([seed, i]).integers(0, 256, size, dtype=np.uint8).tobytes()


def put_blocks(address: str, transport: str, prefix: str, n: int, seed: int) -> None:
    with KVClient(address, ClientConfig(transports=(transport,))) as c:
        sizes = mixed_sizes(n, seed)
        for start in range(0, n, 50):
            idx = range(start, min(n, start + 50))
            c.put_many([f"{prefix}/{i}" for i in idx], [block(seed, i, sizes[i]) for i in idx])


def check_blocks(address: str, transport: str, prefix: str, n: int, seed: int) -> None:
    with KVClient(address, ClientConfig(transports=(transport,))) as c:
        sizes = mixed_sizes(n, seed)
        for start in range(0, n, 50):
            idx = list(range(start, min(n, start + 50)))
            got = c.get_many([f"{prefix}/{i}" for i in idx])
            for i, value in zip(idx, got):
                if value != block(seed, i, sizes[i]):
                    raise SystemExit(f"block {i} differs ({len(value)} bytes read, {sizes[i]} expected)")


def random_ops(address: str, transport: str, worker: int, ops: int) -> None:
    """Random put/get/remove over a key space shared by all workers. A key's value is a function
    of the key alone, so any value read can be checked whoever wrote it."""
    rng = random.Random(worker)
    counts = {"put": 0, "get": 0, "miss": 0, "remove": 0, "busy": 0}
    with KVClient(address, ClientConfig(transports=(transport,))) as c:
        for _ in range(ops):
            k = rng.randrange(200)
            key, value = f"shared/{k}", block(7, k, 1 + (k * 7919) % 20000)
            op = rng.random()
            try:
                if op < 0.4:
                    c.put(key, value)
                    counts["put"] += 1
                elif op < 0.85:
                    if c.get(key) != value:
                        raise SystemExit(f"corrupt read of {key}")
                    counts["get"] += 1
                else:
                    c.remove(key, force=True)
                    counts["remove"] += 1
            except KeyNotFound:
                counts["miss"] += 1
            except KeyBusy:
                counts["busy"] += 1
    print(json.dumps(counts))


if __name__ == "__main__":
    cmd, address, transport, *rest = sys.argv[1:]
    if cmd == "put":
        put_blocks(address, transport, rest[0], int(rest[1]), int(rest[2]))
    elif cmd == "check":
        check_blocks(address, transport, rest[0], int(rest[1]), int(rest[2]))
    elif cmd == "random":
        random_ops(address, transport, int(rest[0]), int(rest[1]))
    else:
        raise SystemExit(f"unknown command {cmd}")
