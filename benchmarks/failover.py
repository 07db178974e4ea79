"""Failover as a client sees it: seconds from a kill -9 of the leading metadata service to the first
put its standby acknowledges, at the default TTLs. Real processes: a redis-server (AOF on), two
`kvstore meta` on it, one daemon, and a client that puts distinct bytes in a loop from the kill on.

`python -m benchmarks.failover [RUNS]` prints min/median/max of RUNS (default 3) failovers.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time

from benchmarks.peers.redis import RedisServer
from kvstore.bench.procs import ServerProcess
from kvstore.config import ClientConfig, random_secret
from kvstore.errors import KVStoreError

READY_S = 60.0
VALUE = 64 << 10


def once(run: int) -> float:
    from kvstore.client import KVClient

    redis = RedisServer(persist=True)
    env = dict(os.environ, KVSTORE_SECRET=random_secret(), PYTHONUNBUFFERED="1")
    procs: list[ServerProcess] = []
    try:
        url = f"redis://127.0.0.1:{redis.port}/0"
        first = ServerProcess(["meta", "--port", "0", "--redis", url], env)
        procs.append(first)
        addresses = [first.wait_ready(READY_S)]
        procs.append(ServerProcess(["meta", "--port", "0", "--redis", url], env))  # the standby
        addresses.append(procs[-1].wait_ready(READY_S))
        both = ",".join(addresses)
        procs.append(ServerProcess(["daemon", "--meta", both, "--dram", "64MiB"], env))
        procs[-1].wait_ready(READY_S)
        with KVClient(both, ClientConfig(timeout_s=READY_S)) as client:
            client.put(f"before-{run}", os.urandom(VALUE))  # the first service leads, writes open
            os.kill(first.pid, signal.SIGKILL)
            killed = time.monotonic()
            first.popen.wait()
            while True:
                try:
                    client.put(f"after-{run}-{time.monotonic_ns()}", os.urandom(VALUE))
                    return time.monotonic() - killed
                except KVStoreError:
                    continue  # the client already waited what the service told it to
    finally:
        for proc in reversed(procs):
            proc.stop()
        redis.stop()


def main(argv: list[str]) -> None:
    runs = int(argv[0]) if argv else 3
    seconds = [once(i) for i in range(runs)]
    for i, s in enumerate(seconds):
        print(f"run {i}: first acknowledged put {s:.2f} s after kill -9 of the leader")
    print(
        f"failover, default TTLs, {runs} runs: min {min(seconds):.2f} s, "
        f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
