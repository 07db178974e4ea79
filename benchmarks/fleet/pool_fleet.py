"""N prefill nodes' caches across the hosts of a fleet (benchmarks/fleet/netns.py: network
namespaces joined by a bridge, each link shaped to `link_mbit` or not): node i is a host of its
own, running its `kvstore daemon` (named after it) and its client (pool_node.py), so a node reads
its own daemon on its host (shm) and another node's only across the bridge (tcp).

    local   a `kvstore meta` on each node's host, with that node's daemon only
    global  one `kvstore meta` on a host of its own, over all N daemons

The replay (pool_replay.py) runs here, in the root namespace, and tells each node's client what
to look up, load and store; loads are checked against BlockValues' patterns on the node. Needs
root (docs/fleet.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from benchmarks.fleet.netns import Fleet, Host, missing
from benchmarks.fleet.pool_caches import Holdings, Served, Sharing, pooled_holdings, reachable
from benchmarks.fleet.pool_node import READY, keys_of
from kvstore.bench.trace.format import Request
from kvstore.bench.trace.sizing import KVSize
from kvstore.config import MetaConfig
from tests.cluster import found
from tests.fleet.roles import ENV, REPO, kvstore, spawn_on

# The service's own defaults, not the short leases the fault scenarios run with (roles.ENV): a
# replay is no fault, and a 2 s write grant runs out while a put waits for evicted space.
_META = {
    k: str(getattr(MetaConfig(), k.removeprefix("KVSTORE_META_").lower())) for k in ENV if k.startswith("KVSTORE_META_")
}


class _Node:
    """A node's client process (pool_node.py) on its host: one JSON line out, one back."""

    def __init__(self, net: Fleet, host: Host, argv: list[str]) -> None:
        self.popen = net.popen(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, cwd=REPO, env={**os.environ, **ENV})  # fmt: skip
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if READY not in line:
            raise RuntimeError(f"the pool node on {host.name} did not start ({self.popen.wait()}): {line!r}")

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(cmd) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"a pool node exited ({self.popen.wait()}) during {cmd['op']}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        self.popen.wait(30)


class FleetPool:
    """The PoolCaches of N nodes on fleet hosts; `start()` makes the fleet, `close()` removes it."""

    def __init__(
        self,
        sharing: Sharing,
        nodes: Sequence[str],
        capacity_tokens: int,
        kv: KVSize,
        link_mbit: float | None = None,
        lease_ttl_s: float | None = None,
    ) -> None:
        """`lease_ttl_s`: the services' read lease (default theirs). A block read over tcp keeps
        its space from reuse until the read's grant, which lives as long as the lease, runs out:
        a put into a full pool waits for it."""
        self._env = dict(_META, **({"KVSTORE_META_LEASE_TTL_S": str(lease_ttl_s)} if lease_ttl_s else {}))
        self.sharing = sharing
        self.nodes = tuple(nodes)
        self.kv = kv
        self.link_mbit = link_mbit
        self._dram = kv.store_bytes(capacity_tokens)
        self._segment = kv.segment_bytes(capacity_tokens)
        self._net: Fleet | None = None
        self._clients: dict[str, _Node] = {}
        self._placed: dict[str, str] = {}  # the last global lookup's key -> daemon
        self.failed_puts = 0
        self.lost_between = 0  # blocks a lookup found that the load then missed
        self.bad_loads = 0  # loads whose bytes were not the block's: must stay 0
        self.first_error = ""

    def start(self, max_blocks: int) -> FleetPool:
        reason = missing()
        if reason is not None:
            raise RuntimeError(f"the fleet backend needs network namespaces: {reason}")
        net = self._net = Fleet()
        try:
            hosts = {n: net.add_host(n, self.link_mbit) for n in self.nodes}
            if self.sharing is Sharing.LOCAL:
                metas = {n: self._meta(h) for n, h in hosts.items()}
            else:
                metas = dict.fromkeys(self.nodes, self._meta(net.add_host("pmeta")))
            for n, h in hosts.items():
                spawn_on(net, h, kvstore("daemon", "--meta", metas[n], "--host", h.address, "--daemon-id", n,
                                         "--dram", str(self._dram), "--segment-size", str(self._segment)),
                         env=self._env)  # fmt: skip
            for n, h in hosts.items():
                argv = [sys.executable, "-m", "benchmarks.fleet.pool_node", "--meta", metas[n],
                        "--block-bytes", str(self.kv.block_bytes), "--max-blocks", str(max(1, max_blocks))]  # fmt: skip
                self._clients[n] = _Node(net, h, argv)
        except BaseException:
            self.close()
            raise
        return self

    def _meta(self, host: Host) -> str:
        assert self._net is not None
        proc = spawn_on(self._net, host, kvstore("meta", "--host", host.address, "--port", "0"), env=self._env)
        return found(r"meta=(\S+)", proc.ready_line).group(1)

    def lookup(self, request: Request) -> Holdings:
        keys = keys_of(request.hash_ids)
        if self.sharing is Sharing.LOCAL:
            return Holdings(
                {n: c.call(op="lookup", keys=keys, describe=False)["count"] for n, c in self._clients.items()}, 0
            )
        reply = self._clients[self.nodes[0]].call(op="lookup", keys=keys, describe=True)
        self._placed = dict(zip(keys[: reply["count"]], reply["daemons"], strict=True))
        return pooled_holdings(self.nodes, reply["daemons"])

    def serve(self, node: str, request: Request, holdings: Holdings) -> Served:
        hit = reachable(self.sharing, node, holdings)
        local = self.sharing is Sharing.LOCAL
        r = self._clients[node].call(op="serve", ids=list(request.hash_ids), hit=hit, describe=local)
        loaded = r["loaded"]
        keys = keys_of(request.hash_ids[:loaded])
        read: list[str] = r["daemons"] if local else [self._placed.get(k, "") for k in keys]
        self.lost_between += hit - loaded
        self.bad_loads += r["bad"]
        if r["error"]:
            self.failed_puts += 1
            self.first_error = self.first_error or f"store: {r['error']}"
        return Served(loaded, frozenset(d for d in read if d), r["stored"], sum(d != node for d in read))

    @property
    def evictions(self) -> int:
        clients = list(self._clients.values())
        return sum(
            c.call(op="evictions")["evictions"] for c in (clients if self.sharing is Sharing.LOCAL else clients[:1])
        )

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        if self._net is not None:
            self._net.close()
            self._net = None
