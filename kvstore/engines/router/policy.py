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
                             + weight * prefill(k) * streams(i)          (streams stalled now)
                             + weight * arrivals(i) * prefill(k)^2 / 2   (requests arriving while
                                                                          it computes wait half of
                                                                          it on average)
             streams(i) = requests(i) on an instance that generates; 0 on a prefill instance, whose
             requests queue ahead of this one (counted in queued_tokens) and generate elsewhere.
             transfer_s = link(2n) - link(n - n_l) is what PD adds; saved_s = the rest of
             cost_colocated - cost_pd is what it buys. transfer_s >= saved_s → colocated; else pd.
             arrivals(i) is the measured rate of prompts sent to instance i to compute.

Every decision past rule 1 carries its `Estimate`: the KV bytes and measured bandwidth behind
transfer_s, and saved_s split into queueing, interference and compute; the router logs it and
records it in the request's metrics, whichever rule decided.

`DynamoPolicy` is the baseline (Dynamo's conditional disaggregation): remote prefill iff the
uncached prompt is longer than max_local_prefill_length and the prefill queue has room. On the same
estimates, the cost rule is never worse than it on long prompts, since it picks the cheaper route.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, Protocol

from kvstore.engines.router.telemetry import Telemetry


class Route(str, Enum):
    DECODE = "decode"
    COLOCATED = "colocated"
    PD = "pd"


@dataclass(frozen=True)
class InstanceLoad:
    requests: int = 0  # requests sent and not finished
    tokens: int = 0  # prompt tokens those requests still have to compute


@dataclass(frozen=True)
class Pools:
    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    colocated: tuple[str, ...] = ()
    storeless: frozenset[str] = frozenset()  # instances that cannot load KV from kvstore

    def __post_init__(self) -> None:
        if not (self.decode or self.colocated):
            raise ValueError("a router needs at least one decode or colocated instance")


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    cached_tokens: int = 0  # leading prompt tokens whose KV kvstore holds
    # leading prompt tokens each instance holds in its own cache, where known (from KV events:
    # kvstore/engines/router/prefix_index.py); read by the PrefixAffinity wrapper (affinity.py)
    instance_cached: Mapping[str, int] = field(default_factory=dict)

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens


class Estimate(NamedTuple):
    """What a hand-off would cost and buy for one request, on the router's measurements now."""

    kv_bytes: int  # KV bytes the hand-off moves beyond what the local route loads
    bandwidth: float  # bytes/s, measured from recent loads (or assumed)
    transfer_s: float  # kv_bytes / bandwidth
    compute_saved_s: float  # prefix the prefill instance loads but a store-less local recomputes
    queue_saved_s: float  # prompt tokens queued ahead: local instance minus prefill instance
    interference_saved_s: float  # streams stalled and arrivals delayed: local minus prefill instance

    @property
    def saved_s(self) -> float:
        return self.compute_saved_s + self.queue_saved_s + self.interference_saved_s

    def describe(self) -> str:
        return (
            f"transfer {self.transfer_s * 1e3:.1f} ms ({self.kv_bytes / 1e6:.1f} MB at "
            f"{self.bandwidth / 1e6:.0f} MB/s) vs saved {self.saved_s * 1e3:.1f} ms (queue "
            f"{self.queue_saved_s * 1e3:.1f} + interference {self.interference_saved_s * 1e3:.1f} + "
            f"compute {self.compute_saved_s * 1e3:.1f})"
        )


@dataclass(frozen=True)
class Decision:
    route: Route
    target: str  # the instance that generates the output
    prefill: str | None = None  # the prefill instance (pd only)
    reason: str = ""
    transfer_s: float | None = None
    saved_s: float | None = None
    rule: str = ""  # which rule decided: cached | short | queue | cost | fixed | dynamo | no-pair
    estimate: Estimate | None = None


@dataclass(frozen=True)
class CostModel:
    """The knobs of the cost model (see the module docstring)."""

    kv_bytes_per_token: int = 4096
    cached_fraction: float = 0.9
    max_decode_tail_tokens: int = 64
    min_disagg_tokens: int = 512
    max_prefill_queue: int = 8
    interference_weight: float = 1.0  # a second of stalled decode stream vs a second of TTFT
    default_bandwidth: float = 1e9  # bytes/s, until transfers are measured
    default_prefill_tps: float = 2000.0  # tokens/s, until prefills are measured
    window_s: float = 60.0  # measurements older than this are forgotten
    kv_replicas: int = 1  # replicas of each stored block: a load reads the one behind the fastest link
    max_local_prefill_length: int = 1000  # DynamoPolicy's threshold

    def __post_init__(self) -> None:
        if not 0.0 < self.cached_fraction <= 1.0:
            raise ValueError("cached_fraction must be in (0, 1]")
        names = ("kv_bytes_per_token", "default_bandwidth", "default_prefill_tps", "window_s", "max_prefill_queue",
                 "kv_replicas")  # fmt: skip
        for name in names:
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


def _cached_decision(
    req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad], model: CostModel
) -> Decision | None:
    if not pools.decode or req.cached_tokens <= 0:
        return None
    if (
        req.cached_tokens >= model.cached_fraction * req.prompt_tokens
        or req.uncached_tokens <= model.max_decode_tail_tokens
    ):
        return Decision(
            Route.DECODE,
            least_loaded(pools.decode, loads),
            reason=f"prefix cached: {req.cached_tokens}/{req.prompt_tokens} tokens in kvstore, "
            f"{req.uncached_tokens} recomputed on decode",
            rule="cached",
        )
    return None


class CostPolicy:
    name = "cost"

    def __init__(self, model: CostModel, telemetry: Telemetry) -> None:
        self.model = model
        self.telemetry = telemetry

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        m = self.model
        if (cached := _cached_decision(req, pools, loads, m)) is not None:
            return cached
        local = _local(pools, loads)
        if not pools.prefill or not pools.decode:
            return Decision(Route.COLOCATED, local, reason="no prefill/decode pair configured", rule="no-pair")
        prefill = least_loaded(pools.prefill, loads)
        n_local = req.prompt_tokens if local in pools.storeless else req.uncached_tokens
        est = self.estimate(
            req, n_local, loads.get(local, InstanceLoad()), local, loads.get(prefill, InstanceLoad()), prefill
        )

        def decided(route: Route, target: str, reason: str, rule: str, prefill: str | None = None) -> Decision:
            return Decision(route, target, prefill, reason, est.transfer_s, est.saved_s, rule, est)

        if n_local < m.min_disagg_tokens:
            return decided(
                Route.COLOCATED,
                local,
                f"short prompt: {n_local} tokens to compute < {m.min_disagg_tokens}; {est.describe()}",
                "short",
            )
        p_load, l_load, t = loads.get(prefill, InstanceLoad()), loads.get(local, InstanceLoad()), self.telemetry
        if p_load.requests >= m.max_prefill_queue:
            return decided(
                Route.COLOCATED, local, f"prefill queue full: {p_load.requests} requests on {prefill}", "queue"
            )
        detail = (
            f"{est.describe()}; prefill {req.uncached_tokens / t.prefill_tps() * 1e3:.1f} ms at "
            f"{t.prefill_tps():.0f} tok/s; local {l_load.requests} requests, {t.arrival_rate(local):.2f}/s; "
            f"prefill {p_load.requests} requests, {t.arrival_rate(prefill):.2f}/s"
        )
        if est.transfer_s >= est.saved_s:
            return decided(Route.COLOCATED, local, f"colocated: {detail}", "cost")
        return decided(Route.PD, least_loaded(pools.decode, loads), f"pd: {detail}", "cost", prefill)

    def estimate(
        self, req: RouteRequest, n_local: int, l_load: InstanceLoad, local: str, p_load: InstanceLoad, prefill: str
    ) -> Estimate:
        """The cost model's terms for sending `req` to `prefill` rather than computing `n_local` of
        its tokens on `local` (module docstring, rule 4)."""
        m, t = self.model, self.telemetry
        n, u = req.prompt_tokens, req.uncached_tokens
        tps, bw = t.prefill_tps(), t.bandwidth()

        def interference(load: InstanceLoad, arrivals: float, tokens: int) -> float:
            busy = tokens / tps
            return m.interference_weight * (busy * load.requests + arrivals * busy**2 / 2)

        kv_bytes = (2 * n - (n - n_local)) * m.kv_bytes_per_token
        return Estimate(
            kv_bytes,
            bw,
            kv_bytes / bw,
            (n_local - u) / tps,
            (l_load.tokens - p_load.tokens) / tps,
            interference(l_load, t.arrival_rate(local), n_local)
            - interference(InstanceLoad(0, p_load.tokens), t.arrival_rate(prefill), u),
        )


class DynamoPolicy:
    """The baseline: Dynamo's conditional disaggregation (length and prefill-queue thresholds)."""

    name = "dynamo"

    def __init__(self, model: CostModel) -> None:
        self.model = model

    def decide(self, req: RouteRequest, pools: Pools, loads: Mapping[str, InstanceLoad]) -> Decision:
        m = self.model
        local = _local(pools, loads)
        if not pools.prefill or not pools.decode:
            return Decision(Route.COLOCATED, local, reason="no prefill/decode pair configured", rule="no-pair")
        prefill = least_loaded(pools.prefill, loads)
        queue = loads.get(prefill, InstanceLoad()).requests
        if req.uncached_tokens > m.max_local_prefill_length and queue < m.max_prefill_queue:
            return Decision(
                Route.PD,
                least_loaded(pools.decode, loads),
                prefill,
                reason=f"dynamo: {req.uncached_tokens} uncached > {m.max_local_prefill_length}, "
                f"prefill queue {queue} < {m.max_prefill_queue}",
                rule="dynamo",
            )
        return Decision(
            Route.COLOCATED,
            local,
            reason=f"dynamo: local prefill of {req.uncached_tokens} tokens (prefill queue {queue})",
            rule="dynamo",
        )


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
            return Decision(Route.COLOCATED, _local(pools, loads), reason="fixed: colocated", rule="fixed")
        if (cached := _cached_decision(req, pools, loads, self.model)) is not None:
            return cached
        return Decision(
            Route.PD,
            least_loaded(pools.decode, loads),
            least_loaded(pools.prefill, loads),
            reason="fixed: pd",
            rule="fixed",
        )


def make_policy(name: str, model: CostModel, telemetry: Telemetry) -> Policy:
    if name == "cost":
        return CostPolicy(model, telemetry)
    if name == "dynamo":
        return DynamoPolicy(model)
    if name in ("colocated", "pd"):
        return FixedPolicy(Route(name), model)
    raise ValueError(f"unknown policy {name!r}: use cost, dynamo, colocated or pd")
