"""Per-request serving metrics: one record per request, exported to Prometheus and as JSON lines.

Time spent moving KV (save, load) is kept apart from time spent computing it (prefill, and any
recompute on the decode side), so a slow link is never mistaken for slow prefill. A figure nobody
on the request's path measured is None, never 0: the vLLM backend's router cannot see what a
decode instance loaded, and says so. What failed on the way (a lookup, a save, a load) and the
prompt tokens recomputed because KV did not arrive are counted per request and per component.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

log = logging.getLogger("kvstore.engines.metrics")

_RECENT = 1000  # requests the summary's quantiles are taken over
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class RequestMetrics:
    """What happened to one request. Times are seconds; None where a phase did not happen."""

    request_id: str
    route: str  # engine: its role; router: colocated | pd | decode
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # prompt tokens whose KV was loaded from kvstore
    prefill_tokens: int = 0  # prompt tokens computed by a prefill or colocated instance
    recompute_tokens: int | None = None  # prompt tokens computed by the decode instance (router only)
    output_tokens: int = 0
    queue_s: float = 0.0  # waiting for an instance, all instances together
    prefill_compute_s: float = 0.0  # computing the prompt on the prefill/colocated instance
    # In the running batch before its first token, not computing its own tokens (batch-mates'
    # tokens, steps between its chunks, the loop noticing a load ended): all instances together.
    batch_wait_s: float = 0.0
    recompute_s: float | None = None  # computing prompt tokens on the decode instance (router only)
    kv_save_s: float | None = None  # storing new blocks (may overlap compute)
    kv_save_bytes: int | None = None
    kv_load_s: float | None = None  # loading cached blocks
    kv_load_bytes: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None  # mean time per output token after the first
    e2e_s: float = 0.0
    fallback: str | None = None  # why KV that should have come from kvstore was recomputed
    reason: str = ""  # router: why it chose this route
    error: str | None = None
    decode_steps: int = 0  # engine steps that computed one of its output tokens
    decode_steps_with_prefill: int = 0  # ...of those, steps whose batch also computed prompt tokens
    decode_steps_prefill_tokens: int = 0  # ...and the prompt tokens those batches computed, summed
    preemptions: int = 0  # times its blocks were taken and it was recomputed later
    itl_s: list[float] = field(default_factory=list)  # gaps between its output tokens, at the instance
    route_rule: str = ""  # router: the policy rule that chose the route
    est_kv_bytes: int | None = None  # router: KV a hand-off would move (beyond a local load)
    est_bandwidth: float | None = None  # router: link bytes/s it assumed (measured from recent loads)
    est_transfer_s: float | None = None  # router: est_kv_bytes / est_bandwidth
    est_saved_s: float | None = None  # router: what PD would save, in all
    est_queue_saved_s: float | None = None  # ...in waiting for an instance
    est_interference_saved_s: float | None = None  # ...in stalled streams and delayed arrivals
    # What failed on the way: True / False where someone on the path could tell, else None.
    kv_lookup_failed: bool | None = None  # asking kvstore what it holds (router, prefill or decode)
    kv_save_failed: bool | None = None  # storing the prompt's new blocks
    kv_load_failed: bool | None = None  # loading the blocks a lookup listed
    kv_missing_tokens: int | None = None  # prompt tokens recomputed because their KV did not arrive
    # The router's split of TTFT: queue, prefill, batch (batch_wait_s), kv_put, kv_get, first_step
    # (the generating instance's compute up to its first token, after the prefill instance's),
    # other (the rest: network, the router itself; saves that overlap compute make the parts sum
    # past TTFT).
    ttft_phases: dict[str, float] | None = None

    @classmethod
    def measured(cls, request_id: str, route: str, **fields: Any) -> RequestMetrics:
        """A record whose KV figures start at a measured 0 (an engine sees all it moves)."""
        zeros = {
            "cached_tokens": 0,
            "kv_save_s": 0.0,
            "kv_save_bytes": 0,
            "kv_load_s": 0.0,
            "kv_load_bytes": 0,
            "kv_missing_tokens": 0,
        }
        return cls(request_id, route, **{**zeros, **fields})

    def add_failures(
        self,
        *,
        lookup: bool | None = None,
        save: bool | None = None,
        load: bool | None = None,
        missing_tokens: int | None = None,
    ) -> None:
        """Fold in what one component on the request's path saw (None: it could not tell). A
        failure anywhere on the path is the request's; missing tokens add up."""
        self.kv_lookup_failed = _either(self.kv_lookup_failed, lookup)
        self.kv_save_failed = _either(self.kv_save_failed, save)
        self.kv_load_failed = _either(self.kv_load_failed, load)
        if missing_tokens is not None:
            self.kv_missing_tokens = (self.kv_missing_tokens or 0) + missing_tokens

    def split_ttft(self) -> dict[str, float] | None:
        """This record's TTFT split into phases (see `ttft_phases`), or None without a TTFT."""
        if self.ttft_s is None:
            return None
        phases = {
            "queue": self.queue_s,
            "prefill": self.prefill_compute_s,
            "batch": self.batch_wait_s,
            "kv_put": self.kv_save_s or 0.0,
            "kv_get": self.kv_load_s or 0.0,
            "first_step": (self.recompute_s or 0.0) if self.route != "colocated" else 0.0,
        }
        phases["other"] = max(0.0, self.ttft_s - sum(phases.values()))
        return {k: round(v, 6) for k, v in phases.items()}

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestMetrics:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _quantile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted values."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _either(a: bool | None, b: bool | None) -> bool | None:
    return None if a is None and b is None else bool(a) or bool(b)


class MetricsSink:
    """Where finished requests go. `component` prefixes every metric (kvstore_engine_...,
    kvstore_router_...); each sink has its own registry, so several live in one process."""

    def __init__(self, component: str, jsonl: IO[str] | None = None) -> None:
        self.registry = CollectorRegistry()
        self._jsonl = jsonl
        self._lock = threading.Lock()
        ns = f"kvstore_{component}"
        self._hist = {
            name: Histogram(f"{ns}_{name}_seconds", help_, ["route"], registry=self.registry, buckets=_SECONDS)
            for name, help_ in [
                ("queue", "time waiting for an instance"),
                ("prefill_compute", "prompt compute on the prefill or colocated instance"),
                ("recompute", "prompt compute on the decode instance"),
                ("kv_save", "time storing KV blocks"),
                ("kv_load", "time loading KV blocks"),
                ("ttft", "time to first token"),
                ("tpot", "time per output token after the first"),
                ("e2e", "request latency"),
            ]
        }
        self._requests = Counter(f"{ns}_requests", "finished requests", ["route"], registry=self.registry)
        self._errors = Counter(f"{ns}_request_errors", "requests that failed", ["route"], registry=self.registry)
        self._fallbacks = Counter(
            f"{ns}_fallbacks",
            "requests whose KV transfer failed and were recomputed locally",
            ["reason"],
            registry=self.registry,
        )
        self._tokens = Counter(f"{ns}_tokens", "tokens by kind", ["kind"], registry=self.registry)
        self._bytes = Counter(f"{ns}_kv_bytes", "KV bytes moved", ["direction"], registry=self.registry)
        self._kv_failures = Counter(
            f"{ns}_kv_failures",
            "requests for which a kvstore lookup, save or load failed",
            ["stage"],
            registry=self.registry,
        )
        self._phases = Histogram(
            f"{ns}_ttft_phase_seconds",
            "TTFT split by phase: queue, prefill, batch, kv_put, kv_get, first_step, other",
            ["route", "phase"],
            registry=self.registry,
            buckets=_SECONDS,
        )
        self._recent: deque[RequestMetrics] = deque(maxlen=_RECENT)

    def observe(self, m: RequestMetrics) -> None:
        route = m.route
        self._requests.labels(route).inc()
        if m.error:
            self._errors.labels(route).inc()
        for name in ("queue", "prefill_compute", "recompute", "kv_save", "kv_load", "e2e"):
            value = getattr(m, f"{name}_s")
            if value:
                self._hist[name].labels(route).observe(value)
        for name in ("ttft", "tpot"):
            value = getattr(m, f"{name}_s")
            if value is not None:
                self._hist[name].labels(route).observe(value)
        if m.fallback:
            self._fallbacks.labels(m.fallback).inc()
        # tokens{kind="kv_missing"}: prompt tokens recomputed because their KV did not arrive
        for kind in ("prompt", "cached", "prefill", "recompute", "output", "kv_missing"):
            self._tokens.labels(kind).inc(getattr(m, f"{kind}_tokens") or 0)
        self._bytes.labels("save").inc(m.kv_save_bytes or 0)
        self._bytes.labels("load").inc(m.kv_load_bytes or 0)
        for stage in ("lookup", "save", "load"):
            if getattr(m, f"kv_{stage}_failed"):
                self._kv_failures.labels(stage).inc()
        for phase, seconds in (m.ttft_phases or {}).items():
            self._phases.labels(route, phase).observe(seconds)
        with self._lock:
            self._recent.append(m)
        line = m.to_json()
        log.info("request %s", line, extra={"request_id": m.request_id})
        if self._jsonl is not None:
            with self._lock:
                self._jsonl.write(line + "\n")
                self._jsonl.flush()

    def fallbacks(self) -> int:
        return int(
            sum(s.value for metric in self._fallbacks.collect() for s in metric.samples if s.name.endswith("_total"))
        )

    def summary(self) -> dict[str, Any]:
        """TTFT and TPOT p50/p99 and the fallback rate over the last requests (the dashboard's
        figures; exact over that window, unlike quantiles from histogram buckets)."""
        with self._lock:
            recent = list(self._recent)
        ttft = sorted(m.ttft_s for m in recent if m.ttft_s is not None)
        tpot = sorted(m.tpot_s for m in recent if m.tpot_s is not None)
        return {
            "requests": len(recent),
            "ttft_p50_s": _quantile(ttft, 0.5),
            "ttft_p99_s": _quantile(ttft, 0.99),
            "tpot_p50_s": _quantile(tpot, 0.5),
            "tpot_p99_s": _quantile(tpot, 0.99),
            "fallback_rate": sum(1 for m in recent if m.fallback) / len(recent) if recent else None,
            "error_rate": sum(1 for m in recent if m.error) / len(recent) if recent else None,
        }

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
