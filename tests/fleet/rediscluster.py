"""A real Redis Cluster across fleet hosts: r1..r6, each a namespace running one redis-server in
cluster mode (AOF everysec, node timeout 1 s), joined by `redis-cli --cluster create` into three
masters with a replica each. A node can be killed (SIGKILL of its pid) and started again on the
same files (its nodes.conf: it rejoins, as a replica if its slots failed over meanwhile). Every
wait is for a real signal: PING, `cluster_state:ok`, a node's ROLE."""

from __future__ import annotations

import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fleet.netns import Fleet, Host
from tests.cluster import wait_until

PORT = 6379
NODES = 6  # three masters, a replica each


def _end(buf: bytes, at: int = 0) -> int:
    """Where the RESP reply starting at `at` ends, or -1 if `buf` does not hold all of it yet."""
    line = buf.find(b"\r\n", at)
    if line < 0:
        return -1
    kind, head = buf[at : at + 1], buf[at + 1 : line]
    if kind == b"$":
        end = line + 2 + max(int(head), 0) + (2 if int(head) >= 0 else 0)
        return end if len(buf) >= end else -1
    if kind == b"*":
        end = line + 2
        for _ in range(max(int(head), 0)):
            end = _end(buf, end)
            if end < 0:
                return -1
        return end
    return line + 2  # +simple, -error, :integer


def ask(address: str, *command: str) -> bytes:
    """One command in RESP, its whole reply's raw bytes (asked from the root namespace, which no
    partition separates from a host); b"" where the node does not answer."""
    frame = f"*{len(command)}\r\n".encode() + b"".join(f"${len(c)}\r\n{c}\r\n".encode() for c in command)
    try:
        with socket.create_connection((address, PORT), timeout=1) as s:
            s.sendall(frame)
            reply = b""
            while (chunk := s.recv(65536)) and _end(reply := reply + chunk) < 0:
                pass
            return reply
    except OSError:
        return b""


@dataclass
class Node:
    host: Host
    directory: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return self.host.address

    def cluster_ok(self) -> bool:
        return b"cluster_state:ok" in ask(self.address, "CLUSTER", "INFO")

    def role(self) -> str:
        """master, slave, or "" (not answering)."""
        reply = ask(self.address, "ROLE").split(b"\r\n")
        return reply[2].decode() if len(reply) > 2 else ""


def repl_offset(node: Node) -> int:
    """How far `node` has come in its shard's replication stream (INFO replication)."""
    for line in ask(node.address, "INFO", "replication").decode(errors="replace").splitlines():
        if line.startswith("master_repl_offset:"):
            return int(line.split(":", 1)[1])
    return -1


@dataclass
class RedisCluster:
    net: Fleet
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://{self.nodes[0].address}:{PORT}/0"

    def start(self, node: Node) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--port", str(PORT), "--bind", node.address, "--dir", str(node.directory),
                "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "no",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "1000"]  # fmt: skip
        node.proc = self.net.popen(node.host, argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: ask(node.address, "PING").startswith(b"+PONG"), timeout=20,
                   what=f"redis-server on {node.host.name} to answer PING")  # fmt: skip

    def kill(self, node: Node) -> None:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)

    def master_of(self, key: str) -> Node:
        """The node that serves `key`'s slot now."""
        slot = int(ask(self.nodes[0].address, "CLUSTER", "KEYSLOT", key).strip(b":\r\n"))
        for node in self.nodes:
            if node.role() == "master" and self._serves(node, slot):
                return node
        raise AssertionError(f"no master serves slot {slot}")

    def _serves(self, node: Node, slot: int) -> bool:
        """Whether `node` itself owns `slot` (CLUSTER NODES' `myself` line lists its slot ranges)."""
        for line in ask(node.address, "CLUSTER", "NODES").decode(errors="replace").splitlines():
            fields = line.split()
            if len(fields) > 8 and "myself" in fields[2]:
                for part in fields[8:]:
                    lo, _, hi = part.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return True
        return False

    def replica_of(self, master: Node) -> Node:
        """The node replicating `master` (ROLE: slave, then its master's address)."""
        for node in self.nodes:
            role = ask(node.address, "ROLE").split(b"\r\n")
            if node is not master and len(role) > 4 and role[2] == b"slave" and role[4] == master.address.encode():
                return node
        raise AssertionError(f"{master.host.name} has no replica")


def start(net: Fleet, tmp: Path) -> RedisCluster:
    """Hosts r1..r6 with the cluster made and every node at cluster_state:ok."""
    cluster = RedisCluster(net)
    for i in range(1, NODES + 1):
        cluster.nodes.append(Node(net.add_host(f"r{i}"), tmp / f"redis{i}"))
    for node in cluster.nodes:
        cluster.start(node)
    addresses = [f"{n.address}:{PORT}" for n in cluster.nodes]
    subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    wait_until(lambda: all(n.cluster_ok() for n in cluster.nodes), timeout=60, what="the Redis Cluster to be ok")
    return cluster
