"""A trace through N prefill nodes: per request, in trace order, what each node's cache (and the
pool) holds, the router's node, then that node loads what it can reach and stores the rest; its
prefill, of the tokens it did not load, is queued on the node at the trace's arrival time (times
`arrival_scale`), which is what the router's load term reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.fleet.pool_caches import PoolCaches, Sharing
from benchmarks.fleet.pool_router import PoolRouter
from benchmarks.fleet.prefill_cost import PrefillCost
from kvstore.bench.trace.format import Request


@dataclass
class PoolRun:
    sharing: Sharing
    nodes: tuple[str, ...]
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    prefill_s: float = 0.0  # GPU seconds of prefill, all requests (PrefillCost)
    full_prefill_s: float = 0.0  # the same with nothing cached
    per_node: dict[str, int] = field(default_factory=dict)  # requests each node served
    reads: dict[str, set[str]] = field(default_factory=dict)  # per node: the nodes' daemons it read
    remote_blocks: int = 0  # blocks a node loaded from another node's daemon
    loaded_blocks: int = 0
    wall_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def mean_prefill_s(self) -> float:
        return self.prefill_s / self.requests if self.requests else 0.0

    def only_own_reads(self) -> bool:
        """Every node read only its own daemon (what local caches must show)."""
        return all(read <= {node} for node, read in self.reads.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "sharing": self.sharing.value,
            "nodes": list(self.nodes),
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "computed_tokens": self.computed_tokens,
            "prefill_s": self.prefill_s,
            "mean_prefill_s": self.mean_prefill_s,
            "full_prefill_s": self.full_prefill_s,
            "per_node": self.per_node,
            "reads": {n: sorted(r) for n, r in self.reads.items()},
            "loaded_blocks": self.loaded_blocks,
            "remote_blocks": self.remote_blocks,
            "wall_s": self.wall_s,
        }


def run_pool(
    requests: Sequence[Request],
    caches: PoolCaches,
    cost: PrefillCost,
    arrival_scale: float = 1.0,
    on_request: Callable[[int], None] | None = None,
    cache_aware: bool = True,
) -> PoolRun:
    """Replay `requests` through `caches`' nodes, routed by PoolRouter on the trace's clock; not
    `cache_aware`, the router is told nothing of the caches (least-loaded only: a bracket)."""
    if arrival_scale <= 0:
        raise ValueError("arrival_scale must be positive")
    router = PoolRouter(caches.nodes, cost)
    run = PoolRun(caches.sharing, caches.nodes)
    run.per_node = dict.fromkeys(caches.nodes, 0)
    run.reads = {n: set() for n in caches.nodes}
    start = time.perf_counter()
    t0 = requests[0].timestamp_ms if requests else 0
    for i, request in enumerate(requests):
        now_s = (request.timestamp_ms - t0) / 1000 * arrival_scale
        holdings = caches.lookup(request)
        own = {n: request.tokens_in(b) for n, b in holdings.own.items()} if cache_aware else {}
        pooled = request.tokens_in(holdings.pooled) if cache_aware else 0
        node = router.choose(now_s, request.input_length, own, pooled)
        served = caches.serve(node, request, holdings)
        hit = request.tokens_in(served.hit_blocks)
        run.requests += 1
        run.prompt_tokens += request.input_length
        run.hit_tokens += hit
        run.prefill_s += router.admit(node, now_s, request.input_length, hit)
        run.full_prefill_s += cost.seconds(request.input_length)
        run.per_node[node] += 1
        run.reads[node] |= served.read_from
        run.loaded_blocks += served.hit_blocks
        run.remote_blocks += served.remote_blocks
        if on_request is not None:
            on_request(i)
    run.wall_s = time.perf_counter() - start
    return run
