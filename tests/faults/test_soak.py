"""The soak: clients put and read a changing working set while daemons are killed, stopped and
restarted at random, for `--soak SECONDS` (skipped without it). Throughout, every read returns
the exact bytes of its key or a typed error, and at the end every key that is still stored is
byte-identical and the service's invariants hold (checked through its stats)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KVStoreError
from tests.cluster import wait_until

SIZES = (4096, 65536, 1 << 20)


def value(key: str) -> bytes:
    """The key's bytes (content addressed: a key always names the same bytes)."""
    seed = key.encode()
    size = SIZES[sum(seed) % len(SIZES)]
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def soak_s(request: pytest.FixtureRequest) -> float:
    seconds = float(request.config.getoption("--soak"))
    if seconds <= 0:
        pytest.skip("the soak runs with --soak SECONDS")
    return seconds


def test_soak(faults, soak_s):
    _, meta = faults.meta({"KVSTORE_META_HEARTBEAT_TTL_S": "3"})
    daemons = [faults.daemon(meta, "64MiB", None, "--segment-size", "16MiB", "--daemon-id", f"d{i}") for i in range(3)]
    rng = random.Random(1)
    stop = threading.Event()
    wrong: list[str] = []
    counts = {"puts": 0, "reads": 0, "errors": 0}

    def worker(n: int) -> None:
        local = random.Random(n)
        with KVClient(meta, ClientConfig(replica_num=2, timeout_s=10, replica_timeout_s=1)) as client:
            while not stop.is_set():
                keys = [f"w{n}/{local.randrange(400)}" for _ in range(8)]
                keys = list(dict.fromkeys(keys))
                try:
                    client.put_many(keys, [value(k) for k in keys])
                    counts["puts"] += len(keys)
                except KVStoreError:
                    counts["errors"] += 1
                buffers = [bytearray(1 << 20) for _ in keys]
                got = client.get_many_into(keys, buffers, strict=False)
                for key, buf, result in zip(keys, buffers, got, strict=True):
                    if isinstance(result, int):
                        counts["reads"] += 1
                        if bytes(buf[:result]) != value(key):
                            wrong.append(f"{key}: {result} bytes, not its own")
                    elif not isinstance(result, KVStoreError):
                        wrong.append(f"{key}: {result!r}")

    workers = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(3)]
    for w in workers:
        w.start()
    ends = time.monotonic() + soak_s
    while time.monotonic() < ends:
        victim = rng.randrange(3)
        action = rng.choice(("kill", "stop"))
        if action == "stop":
            os.kill(daemons[victim].pid, signal.SIGSTOP)
            time.sleep(rng.uniform(0.5, 2.0))  # the fault's length, not a wait for a result
            os.kill(daemons[victim].pid, signal.SIGCONT)
        else:
            daemons[victim].kill()
            daemons[victim] = faults.daemon(meta, "64MiB", None, "--segment-size", "16MiB")
        time.sleep(rng.uniform(1.0, 4.0))  # load runs between faults
    stop.set()
    for w in workers:
        w.join(30)
    assert not wrong, wrong[:10]
    with KVClient(meta) as client:
        wait_until(lambda: client.stats().under_replicated == 0, timeout=120, what="replicas copied again")
        for n in range(3):
            keys = [f"w{n}/{i}" for i in range(400)]
            present = [k for k, ok in zip(keys, client.exists_many(keys), strict=True) if ok]
            for key, data in zip(present, client.get_many(present), strict=True):
                assert data == value(key), key
    assert counts["puts"] and counts["reads"]
