"""kvstore beside each peer store measured in the same run (`--compare mooncake,redis`): rows of
the peer's numbers and kvstore's, per transport, with kvstore ÷ peer ratios of the medians; their
section of the bench's report and their part of its JSON document (`comparison`), registered with
the bench by the peer plug-in (benchmarks.peers). targets.toml judges them.

Every ratio is kvstore ÷ peer, whatever the unit: above 1 kvstore moves more (GB/s, ops/s,
keys/s); for latencies and CPU (µs) below 1 kvstore is faster or cheaper.

From the root of a checkout, `kvstore bench --compare PEERS` runs it; so does

    python -m benchmarks.compare [the flags of kvstore bench]

which compares with every peer (mooncake,redis) unless --compare names some.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from kvstore.bench.fmt import fmt_size, fmt_value, table
from kvstore.bench.results import Baseline, Results, Spread, Throughput, to_json

ALL_PEERS = "mooncake,redis"  # benchmarks.peers.PEERS (not imported here: that package imports this module)
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


def document(results: Results) -> dict[str, object]:
    """The JSON document's `comparison`: each available peer's rows, by its label."""
    return {b.path: to_json(comparison(results, b)) for b in available(results)}


def render_peer(results: Results, base: Baseline) -> str:
    """One peer beside kvstore: its numbers, each kvstore path's, and kvstore / peer."""
    rows = comparison(results, base)
    paths = kvstore_paths(results)
    if any(r.what == "prefix match" for r in rows):
        paths = [*paths, KVSTORE_PREFIX_PATH]
    headers = ["what", "size", "mode", "unit", base.path]
    for path in paths:
        headers += [path, "x"]
    body = []
    for r in rows:
        cells = [r.what, fmt_size(r.size) if r.size else "-", r.mode, r.unit, fmt_value(r.baseline.median, r.unit)]
        for path in paths:
            value = r.values.get(path)
            cells += ["-", "-"] if value is None else [fmt_value(value.median, r.unit), f"{r.ratios[path]:.2f}"]
        body.append(cells)
    return "\n".join(
        [
            f"{base.path} (medians; x = kvstore / {base.path}: > 1 kvstore moves more, < 1 for us kvstore is faster):",
            table(headers, body, right=[False, True, False, False] + [True] * (len(headers) - 4)),
        ]
    )


def render_comparison(results: Results) -> str:
    """The report's section of kvstore beside its peers."""
    lines = ["== kvstore vs peer stores (same run, same sizes, same loops) =="]
    for b in results.baselines:
        state = f"unavailable: {b.unavailable}" if b.unavailable else f"measured in {b.seconds:.0f} s"
        lines.append(f"{b.name}: {state}\n  {b.setup}")
    for base in available(results):
        lines.append(render_peer(results, base))
    if results.ceilings:
        by_name: dict[str, list[str]] = {}
        for c in results.ceilings:
            by_name.setdefault(c.name, []).append(f"{fmt_size(c.size)} {c.gbps.median:.2f}")
        lines.append(
            "ceilings (this run, medians): " + "; ".join(f"{n} {', '.join(v)} GB/s" for n, v in by_name.items())
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`kvstore bench` with --compare defaulting to every peer; the bench loads the peers itself."""
    from kvstore.bench import add_arguments, runner

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description="kvstore bench with peer stores measured beside kvstore (default: --compare " + ALL_PEERS + ")",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.compare = args.compare or ALL_PEERS
    result: int = runner.main(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
