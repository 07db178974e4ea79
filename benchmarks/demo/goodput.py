"""What a serving run achieved, the way the disaggregation papers measure it: TTFT and TPOT
percentiles, throughput, and goodput, the requests per second that met both service-level
objectives (DistServe's measure: a fleet is as good as the load it serves within its SLOs).

TTFT is the router's (arrival to first token); TPOT is a request's mean time per output token
after the first, and the ITL values are every gap between two of its tokens, both timed by the
generating instance (a relay on shared cores sees tokens in bursts). A request with one output
token meets any TPOT objective.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from benchmarks.demo.loadgen import Outcome, Run


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0:
            raise ValueError("SLOs must be positive")

    def met(self, o: Outcome) -> bool:
        return (
            o.ok and o.ttft_s is not None and o.ttft_s <= self.ttft_s and (o.tpot_s is None or o.tpot_s <= self.tpot_s)
        )


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); nan for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Summary:
    label: str
    requests: int
    completed: int
    wall_s: float
    ttft_mean: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    itl_p50: float
    itl_p99: float
    output_tokens: int
    met_slo: int
    decode_steps: int
    decode_steps_with_prefill: int
    decode_steps_prefill_tokens: int
    fallbacks: int
    preemptions: int
    routes: dict[str, int]  # route -> requests
    rules: dict[str, int]  # "route/rule" -> requests: why each route was taken

    @property
    def throughput(self) -> float:
        """Output tokens per second."""
        return self.output_tokens / self.wall_s

    @property
    def goodput(self) -> float:
        """Requests per second that met both SLOs."""
        return self.met_slo / self.wall_s

    @property
    def attainment(self) -> float:
        return self.met_slo / self.requests if self.requests else float("nan")

    @property
    def prefill_tokens_per_shared_step(self) -> float:
        """Prompt tokens a decode step shared its batch with, on average over the shared steps."""
        return (
            self.decode_steps_prefill_tokens / self.decode_steps_with_prefill if self.decode_steps_with_prefill else 0.0
        )

    @property
    def shared_share(self) -> float:
        """Share of decode steps whose batch also computed prompt tokens."""
        return self.decode_steps_with_prefill / self.decode_steps if self.decode_steps else 0.0


def summarize(run: Run, slo: SLO, kinds: set[str] | None = None) -> Summary:
    """The run's figures, over every request or those of `kinds` (throughput and goodput over the
    run's wall time either way)."""
    chosen = [o for o in run.outcomes if kinds is None or o.kind in kinds]
    records = [o.record for o in chosen if o.record is not None]
    ok = [(o, o.record) for o in chosen if o.ok and o.record is not None]
    ttft = [r.ttft_s for _, r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for _, r in ok if r.tpot_s is not None]
    itl = [gap for _, r in ok for gap in r.itl_s]
    return Summary(
        run.label,
        len(chosen),
        len(ok),
        run.wall_s,
        sum(ttft) / len(ttft) if ttft else float("nan"),
        percentile(ttft, 0.5),
        percentile(ttft, 0.99),
        percentile(tpot, 0.5),
        percentile(tpot, 0.99),
        percentile(itl, 0.5),
        percentile(itl, 0.99),
        sum(len(o.output) for o, _ in ok),
        sum(slo.met(o) for o in chosen),
        sum(r.decode_steps for r in records),
        sum(r.decode_steps_with_prefill for r in records),
        sum(r.decode_steps_prefill_tokens for r in records),
        sum(1 for r in records if r.fallback),
        sum(r.preemptions for r in records),
        dict(Counter(r.route for r in records)),
        dict(Counter(f"{r.route}/{r.route_rule or '-'}" for r in records)),
    )


def follow_up_hits(run: Run) -> tuple[int, int, int]:
    """(answered follow-up turns, their prompt tokens, of which loaded from kvstore): how much of
    each conversation's history the next turn found stored."""
    later = [(o, o.record) for o in run.outcomes if o.ok and o.record is not None and o.follows is not None]
    return len(later), sum(o.prompt_tokens for o, _ in later), sum(r.cached_tokens or 0 for _, r in later)
