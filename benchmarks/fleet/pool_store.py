"""N prefill nodes' caches on the real store, each node a `kvstore daemon` named after it
(`--daemon-id`), every process on this host (loopback), waited for by its readiness line.

    local   one `kvstore meta` per node, with that node's daemon only: the node's client can be
            granted nothing but its own daemon's bytes (the store has no per-client placement
            rule, so the boundary is the metadata service)
    global  one `kvstore meta` over all N daemons, which places a block on the emptiest and
            evicts least recently used across all: every node's client reads every daemon

Each load is preceded by a Describe of the keys it reads, so a run records which daemons every
node read from (for local, the test's property: its own only). Values are BlockValues' patterns
and every load is checked against them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from benchmarks.fleet.pool_caches import Holdings, Served, Sharing, pooled_holdings, reachable
from kvstore.bench.procs import LocalStore, ServerProcess
from kvstore.bench.trace.format import Request
from kvstore.bench.trace.replay import BlockValues
from kvstore.bench.trace.sizing import KVSize
from kvstore.client import KVClient
from kvstore.config import random_secret
from kvstore.errors import KVStoreError
from kvstore.results import KeyInfo

_READY_S = 60.0


class PooledStore:
    """One metadata service and N daemons (named `names`) on this host."""

    def __init__(self, names: Sequence[str], dram: int, segment_size: int) -> None:
        self.names = tuple(names)
        self.dram = dram
        self.segment_size = segment_size
        self.meta_address = ""
        self.procs: list[ServerProcess] = []

    def start(self) -> PooledStore:
        env = dict(os.environ, KVSTORE_SECRET=random_secret(), PYTHONUNBUFFERED="1")
        try:
            meta = ServerProcess(["meta", "--port", "0"], env)
            self.procs.append(meta)
            self.meta_address = meta.wait_ready(_READY_S)
            for name in self.names:  # all started, then all waited for: their imports overlap
                args = ["daemon", "--meta", self.meta_address, "--daemon-id", name]
                args += ["--dram", str(self.dram), "--segment-size", str(self.segment_size)]
                self.procs.append(ServerProcess(args, env))
            for proc in self.procs[1:]:
                proc.wait_ready(_READY_S)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for proc in reversed(self.procs):  # daemons first, so they can unmount
            proc.stop()
        self.procs.clear()


def _daemons(infos: Sequence[KeyInfo]) -> list[str]:
    """The daemon of each key's first replica ("" for a key no longer stored)."""
    return [info.replicas[0].daemon_id if info.replicas else "" for info in infos]


class StorePool:
    """The PoolCaches of N nodes on real daemons; `start()` launches them, `close()` stops them."""

    def __init__(self, sharing: Sharing, nodes: Sequence[str], capacity_tokens: int, kv: KVSize) -> None:
        self.sharing = sharing
        self.nodes = tuple(nodes)
        self.kv = kv
        self._dram = kv.store_bytes(capacity_tokens)
        self._segment = kv.segment_bytes(capacity_tokens)
        self._locals: list[LocalStore] = []
        self._pooled: PooledStore | None = None
        self.clients: dict[str, KVClient] = {}
        self._values: BlockValues | None = None
        self.failed_puts = 0
        self.lost_between = 0  # blocks a lookup found that the load then missed
        self.bad_loads = 0  # loads whose bytes were not the block's: must stay 0
        self.first_error = ""
        self._placed: dict[str, str] = {}  # the last global lookup's key -> daemon

    def start(self, max_blocks: int) -> StorePool:
        self._values = BlockValues(self.kv.block_bytes, max(1, max_blocks))
        try:
            if self.sharing is Sharing.LOCAL:
                self._locals = [LocalStore(self._dram, self._segment, ("--daemon-id", n)) for n in self.nodes]
                with ThreadPoolExecutor(len(self.nodes)) as pool:  # started side by side
                    list(pool.map(LocalStore.start, self._locals))
                for node, store in zip(self.nodes, self._locals, strict=True):
                    self.clients[node] = KVClient(store.meta_address)
            else:
                self._pooled = PooledStore(self.nodes, self._dram, self._segment).start()
                for node in self.nodes:
                    self.clients[node] = KVClient(self._pooled.meta_address)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def pids(self) -> list[int]:
        procs = self._pooled.procs if self._pooled else [p for s in self._locals for p in s.procs]
        return [p.pid for p in procs]

    def _keys(self, request: Request) -> list[str]:
        return [f"pool/{h}" for h in request.hash_ids]

    def lookup(self, request: Request) -> Holdings:
        keys = self._keys(request)
        if self.sharing is Sharing.LOCAL:
            return Holdings({n: c.match_prefix(keys) for n, c in self.clients.items()}, 0)
        pooled = self.clients[self.nodes[0]].match_prefix(keys)
        daemons = _daemons(self.clients[self.nodes[0]].describe(keys[:pooled])) if pooled else []
        self._placed = dict(zip(keys[:pooled], daemons, strict=True))
        return pooled_holdings(self.nodes, daemons)

    def serve(self, node: str, request: Request, holdings: Holdings) -> Served:
        assert self._values is not None, "start() first"
        client, values, ids, keys = self.clients[node], self._values, request.hash_ids, self._keys(request)
        hit = reachable(self.sharing, node, holdings)
        loaded, daemons = 0, list[str]()
        if hit:
            if self.sharing is Sharing.LOCAL:
                daemons = _daemons(client.describe(keys[:hit]))
            else:
                daemons = [self._placed.get(k, "") for k in keys[:hit]]
            results = client.get_many_into(keys[:hit], values.buffers(hit), strict=False)
            while loaded < len(results) and not isinstance(results[loaded], KVStoreError):
                loaded += 1
            self.lost_between += hit - loaded
            self.bad_loads += values.bad_loads(ids[:loaded])
        stored = 0
        if loaded < len(ids):
            try:
                stored = sum(client.put_many(keys[loaded:], values.values(ids[loaded:])))
            except KVStoreError as exc:  # e.g. NoSpace: counted and reported, the replay goes on
                self.failed_puts += 1
                self.first_error = self.first_error or f"store: {type(exc).__name__}: {exc}"
        read = daemons[:loaded]
        return Served(loaded, frozenset(d for d in read if d), stored, sum(d != node for d in read))

    @property
    def evictions(self) -> int:
        return sum(c.stats().evictions for c in self._stats_clients())

    def _stats_clients(self) -> list[KVClient]:
        return list(self.clients.values()) if self.sharing is Sharing.LOCAL else list(self.clients.values())[:1]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        if self._locals:
            with ThreadPoolExecutor(len(self._locals)) as pool:
                list(pool.map(LocalStore.close, self._locals))
        self._locals.clear()
        if self._pooled is not None:
            self._pooled.close()
            self._pooled = None
