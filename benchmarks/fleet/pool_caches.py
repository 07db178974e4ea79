"""The caches of N prefill nodes, as the pool replay (pool_replay.py) sees them: per request, a
`lookup` of what each node holds and what the pool holds, then `serve` on the node the router
chose (load the prefix it can reach, store the rest).

    local   each node reads and writes only its own cache; nothing is pooled
    global  every node reads every node's cache: one pool of N x capacity

Two implementations: the real store (pool_store.py: daemons and metadata services) and, here,
the exact-LRU simulators of kvstore/bench/trace/sim.py, which run the same routing in seconds (and
at the paper's 10 nodes, where 10 daemons would not fit this machine's cores).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

from kvstore.bench.trace.format import Request
from kvstore.bench.trace.sim import LRUCache


class Sharing(str, Enum):
    LOCAL = "local"
    GLOBAL = "global"


class Holdings(NamedTuple):
    own: dict[str, int]  # per node: leading blocks of the prompt on that node's own cache
    pooled: int  # leading blocks every node can load (0 with local caches)


@dataclass(frozen=True)
class Served:
    hit_blocks: int  # leading blocks loaded, not computed
    read_from: frozenset[str]  # the nodes whose caches (daemons) the load read from
    stored_blocks: int  # blocks written by this request
    remote_blocks: int = 0  # of the loaded blocks, those read from another node's cache


class PoolCaches(Protocol):
    sharing: Sharing
    nodes: tuple[str, ...]

    def lookup(self, request: Request) -> Holdings:
        """What each node, and the pool, holds of the prompt. Changes nothing."""

    def serve(self, node: str, request: Request, holdings: Holdings) -> Served:
        """`node` loads the prefix it can reach (its own, or the pool's) and stores the rest."""

    def close(self) -> None: ...


def pooled_holdings(nodes: Sequence[str], daemons: Sequence[str]) -> Holdings:
    """The pool holds the leading len(daemons) blocks, each on the daemon named: each node owns
    the leading run of them on its own daemon (the daemons are named after their nodes)."""
    own = dict.fromkeys(nodes, 0)
    for node in nodes:
        while own[node] < len(daemons) and daemons[own[node]] == node:
            own[node] += 1
    return Holdings(own, len(daemons))


def reachable(sharing: Sharing, node: str, holdings: Holdings) -> int:
    """The leading blocks `node` can load: its own cache's, or with a global pool the pool's."""
    return holdings.pooled if sharing is Sharing.GLOBAL else holdings.own.get(node, 0)


class SimPool:
    """Exact LRU caches of `capacity_blocks` each (local), or one of N x that (global). A global
    block is credited to the node that first stored it (kept across its eviction: a hint for the
    router's own(i) and the remote-read count, not a placement)."""

    def __init__(self, sharing: Sharing, nodes: Sequence[str], capacity_blocks: int) -> None:
        self.sharing = sharing
        self.nodes = tuple(nodes)
        if sharing is Sharing.LOCAL:
            self._caches = {n: LRUCache(capacity_blocks) for n in self.nodes}
        else:
            self._pool = LRUCache(capacity_blocks * len(self.nodes))
            self._writer: dict[int, str] = {}

    def lookup(self, request: Request) -> Holdings:
        blocks = request.hash_ids
        if self.sharing is Sharing.LOCAL:
            return Holdings({n: c.match(blocks) for n, c in self._caches.items()}, 0)
        pooled = self._pool.match(blocks)
        own = dict.fromkeys(self.nodes, 0)
        for n in self.nodes:
            while own[n] < pooled and self._writer.get(blocks[own[n]]) == n:
                own[n] += 1
        return Holdings(own, pooled)

    def serve(self, node: str, request: Request, holdings: Holdings) -> Served:
        blocks = request.hash_ids
        hit = reachable(self.sharing, node, holdings)
        cache = self._caches[node] if self.sharing is Sharing.LOCAL else self._pool
        cache.load(blocks[:hit])
        cache.store(blocks[hit:])
        if self.sharing is Sharing.LOCAL:
            return Served(hit, frozenset([node] if hit else []), len(blocks) - hit)
        sources = [self._writer.get(b, node) for b in blocks[:hit]]
        for b in blocks[hit:]:
            self._writer.setdefault(b, node)
        return Served(hit, frozenset(sources), len(blocks) - hit, sum(s != node for s in sources))

    @property
    def evictions(self) -> int:
        if self.sharing is Sharing.LOCAL:
            return sum(c.evictions for c in self._caches.values())
        return self._pool.evictions

    def close(self) -> None:
        pass
