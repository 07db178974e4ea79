"""kvstore's roles placed on fleet hosts: a redis-server, an HA pair of `kvstore meta` on it, one
`kvstore daemon` per engine host, and client hosts that run tests/fleet/driver.py. Every process
is waited for by a real signal (its readiness line, Redis' PING, the service's role and stats),
and is stopped with the fleet."""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fleet.netns import Fleet, Host
from kvstore.errors import KVStoreError
from kvstore.metaclient.client import MetaClient
from kvstore.wire.calls import ServiceInfo, Stats
from tests.cluster import ADMIN_TOKEN, READY, SECRET, Proc, found, wait_until
from tests.fleet import rediscluster
from tests.fleet.rediscluster import RedisCluster
from tests.ha.conftest import FAST

REPO = Path(__file__).resolve().parents[2]
ENV = {**FAST, "KVSTORE_SECRET": SECRET, "KVSTORE_TOKEN": ADMIN_TOKEN, "PYTHONUNBUFFERED": "1",
       "PYTHONFAULTHANDLER": "1", "KVSTORE_META_ADMIN_PORT": "-1"}  # fmt: skip
REDIS_PORT = 6379


def spawn_on(
    net: Fleet,
    host: Host,
    argv: list[str],
    ready: re.Pattern[str] = READY,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> Proc:
    """Start `argv` on `host` (ENV, and `env`, in its environment) and return once it prints a
    line matching `ready` (stdin is a pipe: a driver stops on a line `stop`)."""
    popen = net.popen(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                      text=True, cwd=REPO, env={**os.environ, **ENV, **(env or {})})  # fmt: skip
    proc = Proc(popen, "")
    lines: queue.Queue[str | None] = queue.Queue()
    stdout = popen.stdout
    assert stdout is not None

    def pump() -> None:
        for line in stdout:
            proc.lines.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"{argv} on {host.name} not ready in {timeout} s:\n{''.join(proc.lines)}") from None
        if line is None:
            raise RuntimeError(f"{argv} on {host.name} exited ({popen.wait()}):\n{''.join(proc.lines)}")
        if m := ready.search(line):
            proc.ready_line = m.group(1) if m.groups() else line
            return proc


def kvstore(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvstore.cli", *args]


def role_of(address: str) -> str:
    """The service's role: leader, standby, or "" where it does not answer (asked from the root
    namespace, which no partition separates from any host)."""
    try:
        with MetaClient(address, timeout_s=2, token=ADMIN_TOKEN) as meta:
            return meta.call(ServiceInfo()).role
    except KVStoreError:
        return ""


def writes_open(address: str) -> bool:
    try:
        with MetaClient(address, timeout_s=2, token=ADMIN_TOKEN) as meta:
            stats = meta.call(Stats())
        return stats.writes_open and stats.reconciling == 0
    except KVStoreError:
        return False


def redis_ping(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class KVFleet:
    """A store across hosts: net.hosts holds redis, meta1, meta2, d1.., c1.."""

    net: Fleet
    tmp: Path
    metas: list[tuple[Host, Proc, str]] = field(default_factory=list)  # (host, process, address)
    daemons: list[tuple[Host, Proc]] = field(default_factory=list)
    clients: list[Host] = field(default_factory=list)
    startup_s: float = 0.0
    redis_cluster: RedisCluster | None = None  # where the records live on a Redis Cluster (r1..r6)

    @property
    def meta_list(self) -> str:
        return ",".join(address for _, _, address in self.metas)

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def leader(self) -> str:
        """The address of the service that says it leads ("" if none does)."""
        return next((a for _, _, a in self.metas if role_of(a) == "leader"), "")

    def driver(self, host: Host, mode: str, *args: str, ready: str = r"driver ready") -> Proc:
        return spawn_on(self.net, host, [sys.executable, "-m", "tests.fleet.driver", mode, "--meta", self.meta_list,
                                         *args], re.compile(ready), timeout=120)  # fmt: skip

    def run_driver(self, host: Host, mode: str, *args: str, timeout: float = 120.0) -> str:
        """Run a driver to its end; its output (it must exit 0)."""
        argv = self.net.command(host, [sys.executable, "-m", "tests.fleet.driver", mode, "--meta", self.meta_list,
                                       *args])  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                              env={**os.environ, **ENV})  # fmt: skip
        assert done.returncode == 0, f"driver {mode} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        return done.stdout


def start(
    net: Fleet, tmp: Path, daemons: int = 2, clients: int = 1, dram: str = "128MiB", redis_cluster: bool = False
) -> KVFleet:
    """Hosts redis, meta1, meta2, d1..dN, c1..cM on `net`, with Redis, the HA pair (meta1 leads)
    and the daemons started and writes open. Prints the start-up time, in parts. With
    `redis_cluster`, a Redis Cluster on r1..r6 instead of redis, and the service's durability
    replicas:1 (an acknowledged change rests on a master and its replica)."""
    t0 = time.monotonic()
    fleet = KVFleet(net, tmp)
    if not redis_cluster:
        net.add_host("redis")
    for i in (1, 2):
        net.add_host(f"meta{i}")
    for i in range(1, daemons + 1):
        net.add_host(f"d{i}")
    fleet.clients = [net.add_host(f"c{i}") for i in range(1, clients + 1)]
    t_hosts = time.monotonic()
    if redis_cluster:
        fleet.redis_cluster = rediscluster.start(net, tmp)
        url, env = fleet.redis_cluster.url, {"KVSTORE_META_DURABILITY": "replicas:1"}
    else:
        url, env = _redis(net, net.hosts["redis"], tmp), {}
    t_redis = time.monotonic()
    for i in (1, 2):
        host = net.hosts[f"meta{i}"]
        proc = spawn_on(net, host, kvstore("meta", "--host", host.address, "--port", "0", "--redis", url), env=env)
        fleet.metas.append((host, proc, found(r"meta=(\S+)", proc.ready_line).group(1)))
        if i == 1:
            wait_until(lambda: role_of(fleet.metas[0][2]) == "leader", timeout=60,
                       what=f"meta1 to lead; it printed:\n{''.join(proc.lines)}")  # fmt: skip
    t_meta = time.monotonic()
    for i in range(1, daemons + 1):
        host = net.hosts[f"d{i}"]
        proc = spawn_on(net, host, kvstore("daemon", "--meta", fleet.meta_list, "--host", host.address,
                                           "--dram", dram, "--segment-size", "64MiB"))  # fmt: skip
        fleet.daemons.append((host, proc))
    wait_until(lambda: writes_open(fleet.metas[0][2]), timeout=30, what="writes to open")
    t_end = time.monotonic()
    fleet.startup_s = t_end - t0
    print(f"fleet up in {fleet.startup_s:.1f} s: {len(net.hosts)} hosts {t_hosts - t0:.1f} s, redis "
          f"{t_redis - t_hosts:.1f} s, 2 meta {t_meta - t_redis:.1f} s, "
          f"{daemons} daemons {t_end - t_meta:.1f} s")  # fmt: skip
    return fleet


def _redis(net: Fleet, redis: Host, tmp: Path) -> str:
    """One redis-server on `redis` (AOF everysec); its URL once it answers PING."""
    (tmp / "redis").mkdir(parents=True, exist_ok=True)
    net.popen(redis, ["redis-server", "--port", str(REDIS_PORT), "--bind", redis.address, "--dir", str(tmp / "redis"),
                      "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "no"],
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wait_until(lambda: redis_ping(redis.address, REDIS_PORT), timeout=20, what="redis-server to answer PING")
    return f"redis://{redis.address}:{REDIS_PORT}/0"
