"""A real redis-server (Debian's package) for tests: its own free port and directory, AOF on,
waited for by PING; killed at the end. Restartable on the same port and files, as after a crash."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bus_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a free port too."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue


class RedisServer:
    def __init__(self, directory: Path, appendfsync: str = "everysec", port: int = 0) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed: run scripts/setup.sh (it installs Debian's redis-server)")
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.appendfsync = appendfsync
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0, *extra: str) -> RedisServer:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--protected-mode", "no", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.ping():  # readiness: it answers PING
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)
        return self

    def start_cluster_node(self) -> RedisServer:
        """Start as a Redis Cluster node (its cluster state in nodes.conf, kept across restarts)."""
        return self.start(20.0, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-node-timeout", "1000")  # fmt: skip

    def cluster_ok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"CLUSTER INFO\r\n")
                return b"cluster_state:ok" in s.recv(4096)
        except OSError:
            return False

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)

    def script_calls(self) -> int:
        """EVAL/EVALSHA calls this server has run."""
        stats = self.client().info("commandstats")
        return sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


class RedisClusterServer:
    """A real Redis Cluster: `masters` masters with one replica each (redis-server in cluster mode
    on free ports, joined by `redis-cli --cluster create`), waited for until every node says
    cluster_state:ok. The same face as RedisServer: url, start, stop, kill (every node)."""

    def __init__(self, directory: Path, masters: int = 3, appendfsync: str = "everysec") -> None:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            pytest.fail("redis-server / redis-cli are not installed: run scripts/setup.sh")
        self.nodes = [RedisServer(directory / f"node{i}", appendfsync, _bus_port()) for i in range(2 * masters)]
        self.masters = masters
        self._created = False

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def start(self, timeout: float = 60.0) -> RedisClusterServer:
        for i, node in enumerate(self.nodes):
            for attempt in range(3):
                try:
                    node.start_cluster_node()
                    break
                except RuntimeError:  # its free port was taken meanwhile (before the cluster exists: pick another)
                    if self._created or attempt == 2:
                        raise
                    node.kill()
                    node = self.nodes[i] = RedisServer(node.dir, node.appendfsync, _bus_port())
        if not self._created:
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1",
                            "--cluster-yes"], check=True, capture_output=True, timeout=60)  # fmt: skip
            self._created = True
        deadline = time.monotonic() + timeout
        while not all(n.cluster_ok() for n in self.nodes):  # readiness: every node sees every slot served
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        return self

    def ping(self) -> bool:
        return all(n.ping() for n in self.nodes)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def client(self):
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(self.url)

    def master_of(self, key: str) -> RedisServer:
        """The node that is master of `key`'s slot now."""
        c = self.client()
        port = c.get_node_from_key(key).port
        c.close()
        return next(n for n in self.nodes if n.port == port)

    def script_calls(self) -> int:
        total = 0
        for node in self.nodes:
            if node.ping():
                stats = node.client().info("commandstats")
                total += sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
        return total
