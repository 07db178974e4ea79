"""Per-request serving metrics: one record per request, exported to Prometheus and as JSON lines.

Time spent moving KV (save, load) is kept apart from time spent computing it (prefill, and any
recompute on the decode side), so a slow link is never mistaken for slow prefill.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import asdict, dataclass
from typing import IO

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

log = logging.getLogger("kvstore.engines.metrics")

_SECONDS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class RequestMetrics:
    """What happened to one request. Times are seconds; None where a phase did not happen."""

    request_id: str
    route: str                          # engine: its role; router: colocated | pd | decode
    prompt_tokens: int = 0
    cached_tokens: int = 0              # prompt tokens whose KV was loaded from kvstore
    prefill_tokens: int = 0             # prompt tokens computed by a prefill or colocated instance
    recompute_tokens: int = 0           # prompt tokens computed by the decode instance (router only)
    output_tokens: int = 0
    queue_s: float = 0.0                # waiting for an instance, all instances together
    prefill_compute_s: float = 0.0      # computing the prompt on the prefill/colocated instance
    recompute_s: float = 0.0            # computing prompt tokens on the decode instance (router only)
    kv_save_s: float = 0.0              # storing new blocks (may overlap compute)
    kv_save_bytes: int = 0
    kv_load_s: float = 0.0              # loading cached blocks
    kv_load_bytes: int = 0
    ttft_s: float | None = None
    tpot_s: float | None = None         # mean time per output token after the first
    e2e_s: float = 0.0
    fallback: str | None = None         # why KV that should have come from kvstore was recomputed
    reason: str = ""                    # router: why it chose this route
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict) -> "RequestMetrics":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


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
            for name, help_ in [("queue", "time waiting for an instance"),
                                ("prefill_compute", "prompt compute on the prefill or colocated instance"),
                                ("recompute", "prompt compute on the decode instance"),
                                ("kv_save", "time storing KV blocks"),
                                ("kv_load", "time loading KV blocks"),
                                ("ttft", "time to first token"),
                                ("tpot", "time per output token after the first"),
                                ("e2e", "request latency")]
        }
        self._requests = Counter(f"{ns}_requests", "finished requests", ["route"], registry=self.registry)
        self._errors = Counter(f"{ns}_request_errors", "requests that failed", ["route"], registry=self.registry)
        self._fallbacks = Counter(f"{ns}_fallbacks", "requests whose KV transfer failed and were "
                                  "recomputed locally", ["reason"], registry=self.registry)
        self._tokens = Counter(f"{ns}_tokens", "tokens by kind", ["kind"], registry=self.registry)
        self._bytes = Counter(f"{ns}_kv_bytes", "KV bytes moved", ["direction"], registry=self.registry)

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
        for kind in ("prompt", "cached", "prefill", "recompute", "output"):
            self._tokens.labels(kind).inc(getattr(m, f"{kind}_tokens"))
        self._bytes.labels("save").inc(m.kv_save_bytes)
        self._bytes.labels("load").inc(m.kv_load_bytes)
        line = m.to_json()
        log.info("request %s", line)
        if self._jsonl is not None:
            with self._lock:
                self._jsonl.write(line + "\n")
                self._jsonl.flush()

    def fallbacks(self) -> int:
        return int(sum(s.value for metric in self._fallbacks.collect() for s in metric.samples
                       if s.name.endswith("_total")))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
