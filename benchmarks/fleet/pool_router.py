"""Which prefill node serves a request: the project's router (PrefixAffinity's instance choice,
kvstore/engines/router/affinity.py) over N colocated nodes, fed each node's queue from a clock
that the trace's timestamps drive, so no wall time enters a decision.

    cost(i) = computed(i) + w x loaded(i) + tokens queued on i      (affinity.cost)

With local caches a node can load only what its own daemon holds (own(i); the store term is 0):
the router sends a request where the longest prefix is cached unless that node's queue costs more
than the prefix saves. That is the local baseline of Mooncake (FAST'25 section 5.3.2: requests go
to the nodes with the higher prefix match, balanced by load as in its Algorithm 1, which adds the
queueing time to the prefill time). With the global pool every node can load the pool's prefix
(store(i)), at w a token where its own daemon does not hold it.

A node computes its requests one after another (FIFO); a request's prefill time is
PrefillCost.seconds(n, hit). Queued seconds are turned into prompt tokens at the node's rate for
this prompt's length, the unit of the router's cost.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.fleet.prefill_cost import PrefillCost
from kvstore.engines.router.affinity import cheapest
from kvstore.engines.router.policy import InstanceLoad, Pools, RouteRequest


@dataclass
class _Queue:
    busy_until_s: float = 0.0
    finishes: deque[float] = field(default_factory=deque)  # of its prefills not yet finished


class NodeQueues:
    """Each node's FIFO of prefills, on the trace's clock (seconds)."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self._queues = {n: _Queue() for n in nodes}

    def loads(self, now_s: float, tokens_per_s: float) -> dict[str, InstanceLoad]:
        out = {}
        for node, q in self._queues.items():
            while q.finishes and q.finishes[0] <= now_s:
                q.finishes.popleft()
            waiting = max(0.0, q.busy_until_s - now_s)
            out[node] = InstanceLoad(len(q.finishes), round(waiting * tokens_per_s))
        return out

    def admit(self, node: str, now_s: float, prefill_s: float) -> float:
        """Queue a prefill of `prefill_s` on `node`; its time to first token (wait + prefill)."""
        q = self._queues[node]
        start = max(q.busy_until_s, now_s)
        q.busy_until_s = start + prefill_s
        q.finishes.append(q.busy_until_s)
        return q.busy_until_s - now_s


class PoolRouter:
    def __init__(self, nodes: Sequence[str], cost: PrefillCost) -> None:
        if len(nodes) < 1 or len(set(nodes)) != len(nodes):
            raise ValueError("a pool needs one or more distinct node names")
        self.nodes = tuple(nodes)
        self.cost = cost
        self.queues = NodeQueues(nodes)
        self._pools = Pools(colocated=self.nodes)

    def choose(self, now_s: float, prompt_tokens: int, own: Mapping[str, int], pooled: int) -> str:
        """The node for a prompt: `own` leading tokens each node's daemon holds, `pooled` the
        leading tokens every node can load (0 with local caches). Pure but for the queue's
        expiry of finished prefills."""
        tps = self.cost.tokens_per_s(prompt_tokens)
        request = RouteRequest(prompt_tokens, pooled, dict(own))
        loads = self.queues.loads(now_s, tps)
        return cheapest(self.nodes, request, self._pools, loads, self.cost.load_weight(prompt_tokens))

    def admit(self, node: str, now_s: float, prompt_tokens: int, hit_tokens: int) -> float:
        """The prefill of a routed request, queued on `node`; returns its GPU seconds."""
        seconds = self.cost.seconds(prompt_tokens, hit_tokens)
        self.queues.admit(node, now_s, seconds)
        return seconds
