"""Where each request's prefill runs, and why: the scheduler of the PD design, as pure logic.

Three routes:

    decode      the prompt's prefix is (mostly) in kvstore: the decode instance loads it and
                recomputes the short tail; no prefill instance is involved
    colocated   one instance computes the prompt and generates: no KV moves
    pd          a prefill instance computes the prompt and saves its KV to kvstore; a decode
                instance loads it and generates

The cost model (`CostPolicy`), in the order its rules apply. n = prompt tokens, c = cached
(leading tokens kvstore holds), u = n - c. The local instance (colocated, else decode) computes
n_l = u tokens if it can load from kvstore, else all n.

1. cached    c >= cached_fraction * n, or u <= max_decode_tail_tokens → decode.
2. short     n_l < min_disagg_tokens → colocated: too little work to be worth a hand-off.
3. full      the least-loaded prefill instance has max_prefill_queue requests → colocated.
4. cost      with prefill(k) = k / prefill_tps and link(k) = k * kv_bytes_per_token / bandwidth
             (both measured from recent requests; bandwidth from loads, the one transfer that
             nothing overlaps):
                 cost_pd        = prefill(u)   + link(2n)  + delay(prefill instance, u)
                 cost_colocated = prefill(n_l) + link(n - n_l) + delay(local instance, n_l)
             (PD loads the cached prefix on the prefill instance, saves the rest, and the decode
             instance loads all n; a colocated instance with a store loads only the prefix.)
                 delay(i, k) = queued_tokens(i) / prefill_tps            (wait to start)
                             + weight * prefill(k) * requests(i)         (streams stalled now)
                             + weight * arrivals(i) * prefill(k)^2 / 2   (requests arriving while
                                                                          it computes wait half of
                                                                          it on average)
             transfer_s = link(2n) - link(n - n_l) is what PD adds; saved_s = the rest of
             cost_colocated - cost_pd is what it buys. transfer_s >= saved_s → colocated; else pd.
             arrivals(i) is the measured rate of prompts sent to instance i to compute.

`DynamoPolicy` is the baseline (Dynamo's conditional disaggregation): remote prefill iff the
uncached prompt is longer than max_local_prefill_length and the prefill queue has room. On the same
estimates, the cost rule is never worse than it on long prompts, since it picks the cheaper route.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Protocol, Sequence

from kvstore.engines.router.telemetry import Telemetry


class Route(str, Enum):
    DECODE = "decode"
    COLOCATED = "colocated"
    PD = "pd"


@dataclass(frozen=True)
class InstanceLoad:
    requests: int = 0               # requests sent and not finished
    tokens: int = 0                 # prompt tokens those requests still have to compute


@dataclass(frozen=True)
class Pools:
    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    colocated: tuple[str, ...] = ()
    storeless: frozenset[str] = frozenset()     # instances that cannot load KV from kvstore

    def __post_init__(self) -> None:
        if not (self.decode or self.colocated):
            raise ValueError("a router needs at least one decode or colocated instance")


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    cached_tokens: int = 0          # leading prompt tokens whose KV kvstore holds

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class Decision:
    route: Route
    target: str                     # the instance that generates the output
    prefill: str | None = None      # the prefill instance (pd only)
    reason: str = ""
    transfer_s: float | None = None
    saved_s: float | None = None


@dataclass(frozen=True)
class CostModel:
    """The knobs of the cost model (see the module docstring)."""

    kv_bytes_per_token: int = 4096
    cached_fraction: float = 0.9
    max_decode_tail_tokens: int = 64
    min_disagg_tokens: int = 512
    max_prefill_queue: int = 8
    interference_weight: float = 1.0    # a second of stalled decode stream vs a second of TTFT
    default_bandwidth: float = 1e9      # bytes/s, until transfers are measured
    default_prefill_tps: float = 2000.0  # tokens/s, until prefills are measured
    window_s: float = 60.0              # measurements older than this are forgotten
    max_local_prefill_length: int = 1000  # DynamoPolicy's threshold

    def __post_init__(self) -> None:
        if not 0.0 < self.cached_fraction <= 1.0:
            raise ValueError("cached_fraction must be in (0, 1]")
        for name in ("kv_bytes_per_token", "default_bandwidth", "default_prefill_tps", "window_s",
                     "max_prefill_queue"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


class Policy(Protocol):
    name: str

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        """Choose a route and instances. Pure: reads `loads`, changes nothing."""


def least_loaded(urls: Sequence[str], loads: Mapping[str, InstanceLoad]) -> str:
    return min(urls, key=lambda u: (loads.get(u, InstanceLoad()).tokens, loads.get(u, InstanceLoad()).requests, u))


def _local(pools: Pools, loads: Mapping[str, InstanceLoad]) -> str:
    """Where a prompt is computed without a hand-off: a colocated instance, else a decode one."""
    return least_loaded(pools.colocated or pools.decode, loads)


def _cached_decision(req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad],
                     model: CostModel) -> Decision | None:
    if not pools.decode or req.cached_tokens <= 0:
        return None
    if (req.cached_tokens >= model.cached_fraction * req.prompt_tokens
            or req.uncached_tokens <= model.max_decode_tail_tokens):
        return Decision(Route.DECODE, least_loaded(pools.decode, loads),
                        reason=f"prefix cached: {req.cached_tokens}/{req.prompt_tokens} tokens in kvstore, "
                               f"{req.uncached_tokens} recomputed on decode")
    return None


class CostPolicy:
    name = "cost"

    def __init__(self, model: CostModel, telemetry: Telemetry) -> None:
        self.model = model
        self.telemetry = telemetry

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        m, t = self.model, self.telemetry
        if (cached := _cached_decision(req, pools, loads, m)) is not None:
            return cached
        local = _local(pools, loads)
        n, u = req.prompt_tokens, req.uncached_tokens
        n_local = n if local in pools.storeless else u
        if not pools.prefill or not pools.decode:
            return Decision(Route.COLOCATED, local, reason="no prefill/decode pair configured")
        if n_local < m.min_disagg_tokens:
            return Decision(Route.COLOCATED, local,
                            reason=f"short prompt: {n_local} tokens to compute < {m.min_disagg_tokens}")
        prefill = least_loaded(pools.prefill, loads)
        p_load, l_load = loads.get(prefill, InstanceLoad()), loads.get(local, InstanceLoad())
        if p_load.requests >= m.max_prefill_queue:
            return Decision(Route.COLOCATED, local, reason=f"prefill queue full: {p_load.requests} requests "
                                                           f"on {prefill}")
        tps, bw = t.prefill_tps(), t.bandwidth()

        def link(tokens: int) -> float:
            return tokens * m.kv_bytes_per_token / bw

        def delay(load: InstanceLoad, arrivals: float, tokens: int) -> float:
            busy = tokens / tps
            return load.tokens / tps + m.interference_weight * (busy * load.requests + arrivals * busy ** 2 / 2)

        transfer_s = link(2 * n) - link(n - n_local)
        saved_s = (n_local - u) / tps + (delay(l_load, t.arrival_rate(local), n_local)
                                         - delay(p_load, t.arrival_rate(prefill), u))
        numbers = (f"transfer {transfer_s * 1e3:.1f} ms ({n} tokens at {bw / 1e6:.0f} MB/s) vs saved "
                   f"{saved_s * 1e3:.1f} ms (prefill {u / tps * 1e3:.1f} ms at {tps:.0f} tok/s; local "
                   f"{l_load.requests} requests, {t.arrival_rate(local):.2f}/s; prefill {p_load.requests} "
                   f"requests, {t.arrival_rate(prefill):.2f}/s)")
        if transfer_s >= saved_s:
            return Decision(Route.COLOCATED, local, reason=f"colocated: {numbers}",
                            transfer_s=transfer_s, saved_s=saved_s)
        return Decision(Route.PD, least_loaded(pools.decode, loads), prefill, reason=f"pd: {numbers}",
                        transfer_s=transfer_s, saved_s=saved_s)


class DynamoPolicy:
    """The baseline: Dynamo's conditional disaggregation (length and prefill-queue thresholds)."""

    name = "dynamo"

    def __init__(self, model: CostModel) -> None:
        self.model = model

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        m = self.model
        local = _local(pools, loads)
        if not pools.prefill or not pools.decode:
            return Decision(Route.COLOCATED, local, reason="no prefill/decode pair configured")
        prefill = least_loaded(pools.prefill, loads)
        queue = loads.get(prefill, InstanceLoad()).requests
        if req.uncached_tokens > m.max_local_prefill_length and queue < m.max_prefill_queue:
            return Decision(Route.PD, least_loaded(pools.decode, loads), prefill,
                            reason=f"dynamo: {req.uncached_tokens} uncached > {m.max_local_prefill_length}, "
                                   f"prefill queue {queue} < {m.max_prefill_queue}")
        return Decision(Route.COLOCATED, local, reason=f"dynamo: local prefill of {req.uncached_tokens} tokens "
                                                       f"(prefill queue {queue})")


class FixedPolicy:
    """Every request on one route (for comparisons): `colocated`, or `pd` (cached prefixes still go
    straight to decode: that is what PD through kvstore does)."""

    def __init__(self, route: Route, model: CostModel) -> None:
        if route is Route.DECODE:
            raise ValueError("the fixed routes are colocated and pd")
        self.route = route
        self.model = model
        self.name = route.value

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        if self.route is Route.COLOCATED or not pools.prefill or not pools.decode:
            return Decision(Route.COLOCATED, _local(pools, loads), reason="fixed: colocated")
        if (cached := _cached_decision(req, pools, loads, self.model)) is not None:
            return cached
        return Decision(Route.PD, least_loaded(pools.decode, loads), least_loaded(pools.prefill, loads),
                        reason="fixed: pd")


def make_policy(name: str, model: CostModel, telemetry: Telemetry) -> Policy:
    if name == "cost":
        return CostPolicy(model, telemetry)
    if name == "dynamo":
        return DynamoPolicy(model)
    if name in ("colocated", "pd"):
        return FixedPolicy(Route(name), model)
    raise ValueError(f"unknown policy {name!r}: use cost, dynamo, colocated or pd")
