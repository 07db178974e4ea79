"""kvstore beside each peer store measured in the same run (`--compare mooncake,redis`), as
values: rows of the peer's numbers and kvstore's, per transport, with kvstore ÷ peer ratios of the
medians. kvstore.bench.report renders them; targets.toml judges them.

Every ratio is kvstore ÷ peer, whatever the unit: above 1 kvstore moves more (GB/s, ops/s,
keys/s); for latencies and CPU (µs) below 1 kvstore is faster or cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.bench.results import Baseline, Results, Spread, Throughput

OPS_UNIT_BELOW = 64 << 10  # smaller blocks are compared in ops/s rather than GB/s
KVSTORE_PREFIX_PATH = "kvstore"


@dataclass(frozen=True)
class ComparisonRow:
    """One measurement of a peer beside the same one through each kvstore path."""

    what: str  # "put", "get", "get p50", "prefix match", "server CPU pair", ...
    size: int  # value size in bytes (0: not about values)
    mode: str  # "single", "batched x32", "1000 keys/call", ...
    unit: str  # "GB/s", "ops/s", "us", "keys/s"
    baseline: Spread
    values: dict[str, Spread] = field(default_factory=dict)  # kvstore path -> value

    @property
    def ratios(self) -> dict[str, float]:
        ref = self.baseline.median
        return {path: v.median / ref if ref else float("nan") for path, v in self.values.items()}


def available(results: Results) -> list[Baseline]:
    """The peers that produced results, in the order they were measured."""
    return [b for b in results.baselines if b.unavailable is None]


def kvstore_paths(results: Results) -> list[str]:
    peers = {b.path for b in results.baselines}
    measured = [t.path for t in results.throughput] + [lat.path for lat in results.latency]
    return list(dict.fromkeys(p for p in measured if p not in peers))


def _metric(t: Throughput) -> Spread:
    return t.ops_per_s if t.size < OPS_UNIT_BELOW else t.gbps


def throughput_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    kv = set(kvstore_paths(results))
    rows = []
    for b in (t for t in results.throughput if t.path == base.path):
        same = {
            t.path: _metric(t)
            for t in results.throughput
            if t.path in kv and (t.op, t.size, t.batch) == (b.op, b.size, b.batch)
        }
        rows.append(
            ComparisonRow(
                b.op,
                b.size,
                b.mode if b.batch == 1 else f"batched x{b.batch}",
                "ops/s" if b.size < OPS_UNIT_BELOW else "GB/s",
                _metric(b),
                same,
            )
        )
    return rows


def latency_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    kv = set(kvstore_paths(results))
    rows = []
    for b in (lat for lat in results.latency if lat.path == base.path):
        same = [lat for lat in results.latency if lat.path in kv and (lat.op, lat.size) == (b.op, b.size)]
        for pct in ("p50", "p99"):
            rows.append(
                ComparisonRow(
                    f"{b.op} {pct}",
                    b.size,
                    "single",
                    "us",
                    getattr(b, f"{pct}_us"),
                    {lat.path: getattr(lat, f"{pct}_us") for lat in same},
                )
            )
    return rows


def cpu_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    kv = set(kvstore_paths(results))
    rows = []
    for b in (c for c in results.server_cpu if c.path == base.path):
        same = {c.path: c.us_per_op for c in results.server_cpu if c.path in kv and (c.op, c.size) == (b.op, b.size)}
        rows.append(ComparisonRow(f"server CPU {b.op}", b.size, "single", "us", b.us_per_op, same))
    return rows


def prefix_rows(results: Results, base: Baseline) -> list[ComparisonRow]:
    """The peer's batched existence call beside kvstore's match_prefix (metadata only: one number)."""
    kv = next((p for p in results.prefix if p.path == KVSTORE_PREFIX_PATH), None)
    rows = []
    for b in (p for p in results.prefix if p.path == base.path):
        mode = f"{b.batch} keys/call" if kv is None or kv.batch == b.batch else f"{kv.batch} vs {b.batch} keys/call"
        rows.append(
            ComparisonRow(
                "prefix match", 0, mode, "keys/s", b.keys_per_s, {KVSTORE_PREFIX_PATH: kv.keys_per_s} if kv else {}
            )
        )
    return rows


def comparison(results: Results, base: Baseline) -> list[ComparisonRow]:
    return [
        *throughput_rows(results, base),
        *latency_rows(results, base),
        *cpu_rows(results, base),
        *prefix_rows(results, base),
    ]
