"""kvstore against a baseline store measured in the same run (`--compare mooncake`), as values:
the side-by-side rows with kvstore ÷ baseline ratios, the issue's comparison targets, and notes
on targets that could not be judged. kvstore.bench.report renders them.

Every ratio is kvstore ÷ baseline, whatever the unit: above 1 kvstore moves more (GB/s, ops/s,
keys/s); for latencies (µs) below 1 kvstore is faster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.bench.results import Baseline, Results, TargetCheck, Throughput

LARGE_BLOCK = 1 << 20
OPS_UNIT_BELOW = 64 << 10        # smaller blocks are compared in ops/s rather than GB/s
KVSTORE_PREFIX_PATH = "kvstore"

BEST_GET_OF_BASELINE = 5.0       # kvstore's best same-host get >= 5 x Mooncake Store's get, >= 1 MiB
TCP_OF_BASELINE = 1.5            # kvstore over tcp >= 1.5 x Mooncake Store (over tcp), >= 1 MiB
MOONCAKE_TRANSPORT_OF_BASELINE = 0.9   # kvstore over the mooncake transport >= 0.9 x Mooncake Store
PREFIX_OF_BATCH_IS_EXIST = 1.0   # match_prefix keys/s >= batch_is_exist keys/s
EXISTS_P50_OF_BASELINE = 2.0     # exists p50 <= 2 x Mooncake Store's is_exist p50


@dataclass(frozen=True)
class ComparisonRow:
    """One measurement of the baseline beside the same one through each kvstore path."""

    what: str                    # "put", "get", "exists p50", "prefix match", ...
    size: int                    # value size in bytes (0: not about values)
    mode: str                    # "single", "batched x32", "1000 keys/call", ...
    unit: str                    # "GB/s", "ops/s", "us", "keys/s"
    baseline: float
    values: dict[str, float] = field(default_factory=dict)     # kvstore path -> value

    @property
    def ratios(self) -> dict[str, float]:
        return {path: v / self.baseline if self.baseline else float("nan") for path, v in self.values.items()}


def baseline(results: Results) -> Baseline | None:
    """The baseline that produced results (the first, if several were measured)."""
    return next((b for b in results.baselines if b.unavailable is None), None)


def kvstore_paths(results: Results, base: Baseline) -> list[str]:
    seen = dict.fromkeys(t.path for t in [*results.throughput, *results.latency] if t.path != base.path)
    return list(seen)


def _metric(t: Throughput) -> float:
    return t.ops_per_s if t.size < OPS_UNIT_BELOW else t.gbps


def throughput_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    rows = []
    for b in (t for t in results.throughput if t.path == base.path):
        same = {t.path: t for t in results.throughput
                if t.path != base.path and (t.op, t.size, t.batch) == (b.op, b.size, b.batch)}
        rows.append(ComparisonRow(b.op, b.size, b.mode if b.batch == 1 else f"batched x{b.batch}",
                                  "ops/s" if b.size < OPS_UNIT_BELOW else "GB/s", _metric(b),
                                  {path: _metric(t) for path, t in same.items()}))
    return rows


def latency_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    rows = []
    for b in (lat for lat in results.latency if lat.path == base.path):
        same = [lat for lat in results.latency if lat.path != base.path and (lat.op, lat.size) == (b.op, b.size)]
        for pct in ("p50", "p99"):
            rows.append(ComparisonRow(f"{b.op} {pct}", b.size, "single", "us", getattr(b, f"{pct}_us"),
                                      {lat.path: getattr(lat, f"{pct}_us") for lat in same}))
    return rows


def prefix_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    """The baseline's batch_is_exist beside kvstore's match_prefix (metadata only: one number)."""
    kv = next((p for p in results.prefix if p.path == KVSTORE_PREFIX_PATH), None)
    rows = []
    for b in (p for p in results.prefix if p.path == base.path):
        mode = f"{b.batch} keys/call" if kv is None or kv.batch == b.batch else f"{kv.batch} vs {b.batch} keys/call"
        rows.append(ComparisonRow("prefix match", 0, mode, "keys/s", b.keys_per_s,
                                  {KVSTORE_PREFIX_PATH: kv.keys_per_s} if kv else {}))
    return rows


def comparison(results: Results) -> list[ComparisonRow]:
    base = baseline(results)
    if base is None:
        return []
    return [*throughput_rows(results, base), *latency_rows(results, base), *prefix_rows(results, base)]


def _large_gets_and_puts(results: Results, base: Baseline) -> list[ComparisonRow]:
    return [r for r in throughput_rows(results, base) if r.size >= LARGE_BLOCK]


def targets(results: Results) -> list[TargetCheck]:
    """The issue's targets against the baseline, for every measurement they apply to."""
    base = baseline(results)
    if base is None:
        return []
    name = base.path
    large = _large_gets_and_puts(results, base)
    checks: list[TargetCheck] = []
    for row in large:
        if row.what == "get" and row.values:
            path, best = max(row.values.items(), key=lambda kv: kv[1])
            checks.append(TargetCheck(f"best kvstore ({path}) {_label(row)} vs {name}", best, row.unit, row.baseline,
                                      f"{BEST_GET_OF_BASELINE:g} x {name} {row.baseline:.2f} {row.unit}",
                                      BEST_GET_OF_BASELINE))
    for path, need in (("tcp", TCP_OF_BASELINE), ("mooncake", MOONCAKE_TRANSPORT_OF_BASELINE)):
        for row in large:
            if path in row.values:
                checks.append(TargetCheck(f"kvstore {path} {_label(row)} vs {name}", row.values[path], row.unit,
                                          row.baseline, f"{need:g} x {name} {row.baseline:.2f} {row.unit}", need))
    for row in prefix_rows(results, base):
        if KVSTORE_PREFIX_PATH in row.values:
            checks.append(TargetCheck(f"match_prefix vs {name} batch_is_exist ({row.mode})",
                                      row.values[KVSTORE_PREFIX_PATH], "keys/s", row.baseline,
                                      f">= {name} {_fmt_rate(row.baseline)} keys/s", PREFIX_OF_BATCH_IS_EXIST))
    for row in latency_rows(results, base):
        if row.what == "exists p50":
            for path, value in row.values.items():
                checks.append(TargetCheck(f"kvstore {path} exists p50 vs {name}", value, "us", row.baseline,
                                          f"<= {EXISTS_P50_OF_BASELINE:g} x {name} {row.baseline:.0f} us",
                                          EXISTS_P50_OF_BASELINE, higher_is_better=False))
    return checks


def unjudged(results: Results) -> list[str]:
    """Targets that could not be judged in this run, and why."""
    if not results.baselines:
        return []
    base = baseline(results)
    if base is None:
        return [f"no comparison target: {', '.join(b.name for b in results.baselines)} unavailable (see above)"]
    notes = []
    large = _large_gets_and_puts(results, base)
    if not large:
        notes.append(f"throughput targets: no block of >= 1 MiB measured on {base.path}")
    for path, need in (("tcp", TCP_OF_BASELINE), ("mooncake", MOONCAKE_TRANSPORT_OF_BASELINE)):
        if large and not any(path in r.values for r in large):
            notes.append(f"kvstore {path} >= {need:g} x {base.path} at >= 1 MiB: not judged "
                         f"(kvstore over {path} not measured; see skipped)")
    if not any(KVSTORE_PREFIX_PATH in r.values for r in prefix_rows(results, base)):
        notes.append(f"match_prefix >= {base.path} batch_is_exist: not judged (one of them not measured)")
    if not any(r.what == "exists p50" and r.values for r in latency_rows(results, base)):
        notes.append(f"exists p50 <= 2 x {base.path}: not judged (one of them not measured)")
    return notes


def _label(row: ComparisonRow) -> str:
    from kvstore.bench.report import fmt_size     # report renders this module, so it comes late

    return f"{row.what} {fmt_size(row.size)} {row.mode}"


def _fmt_rate(x: float) -> str:
    from kvstore.bench.report import fmt_rate

    return fmt_rate(x)
