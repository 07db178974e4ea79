"""PrefixAffinity: any routing policy, plus the instance choice that KV events make possible.

The wrapped policy picks the route (decode, colocated or pd) on the request's length, what
kvstore holds and load, as before. Within the pool it picked from, the instance is then the one
with the least work for this prompt, in prompt-token equivalents:

    cost(i) = computed(i) + w * loaded(i) + tokens queued on i
        own(i)      = leading prompt tokens in i's own cache (vLLM's prefix cache, from its events)
        store(i)    = leading prompt tokens kvstore holds, if i can load from kvstore (else 0)
        computed(i) = prompt tokens - max(own(i), store(i))
        loaded(i)   = max(0, store(i) - own(i))
        w           = what loading a token costs against computing one: link time per token over
                      compute time per token, from the cost model's telemetry

ties broken by fewer requests, then URL. With nothing cached anywhere this is least_loaded's
order, so it only departs from the wrapped policy where an instance's own cache saves what the
others would compute, or load. It is Dynamo's KV router cost (w * prefill_blocks +
decode_blocks) with the queue in tokens, extended by the store tier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from kvstore.engines.router.policy import Decision, InstanceLoad, Policy, Pools, RouteRequest


class PrefixAffinity:
    def __init__(self, inner: Policy, load_weight: Callable[[], float] = lambda: 0.0) -> None:
        self.inner = inner
        self.name = f"{inner.name}+prefix"
        self._load_weight = load_weight

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        decision = self.inner.decide(req, pools, loads)
        if not any(req.instance_cached.values()):
            return decision
        w = self._load_weight()
        pool = pools.colocated if decision.target in pools.colocated else pools.decode
        target = cheapest(pool, req, pools, loads, w) if decision.target in pool else decision.target
        prefill = cheapest(pools.prefill, req, pools, loads, w) if decision.prefill is not None else None
        if (target, prefill) == (decision.target, decision.prefill):
            return decision
        chosen = prefill or target
        note = (
            f"; prefix affinity: {target}"
            + (f" (prefill {prefill})" if prefill else "")
            + f" holds {req.instance_cached.get(chosen, 0)} of {req.prompt_tokens} tokens"
        )
        return replace(decision, target=target, prefill=prefill, reason=decision.reason + note)


def cost(
    url: str, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad], w: float = 0.0
) -> tuple[float, int, str]:
    n = req.prompt_tokens
    own = min(req.instance_cached.get(url, 0), n)
    store = 0 if url in pools.storeless else min(req.cached_tokens, n)
    load = loads.get(url, InstanceLoad())
    return (n - max(own, store) + w * max(0, store - own) + load.tokens, load.requests, url)


def cheapest(
    urls: Sequence[str], req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad], w: float = 0.0
) -> str:
    return min(urls, key=lambda u: cost(u, req, pools, loads, w))
