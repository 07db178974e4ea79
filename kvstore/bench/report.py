"""The human-readable report of a bench run: every measurement as median (min-max) of its
repetitions, each peer beside kvstore (the peer plug-in's section, kvstore.bench.plugin), and
every target of targets.toml, met or not.

A missed target is reported, never raised: the bench is a measurement, not a test.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstore.bench import targets
from kvstore.bench.fmt import fmt_size, fmt_spread, table
from kvstore.bench.results import Results, Spread

_OP_NOTE = "get: the reading client's first read of each key; get-warm: the same keys read again"


def _reps(s: Spread) -> str:
    return str(s.n)


def _ceilings(results: Results) -> str:
    rows = [[c.name, fmt_size(c.size), fmt_spread(c.gbps, "GB/s"), _reps(c.gbps)] for c in results.ceilings]
    return "== ceilings (this run; median (min-max) of the repetitions) ==\n" + table(
        ["what", "size", "GB/s", "reps"], rows
    )


def _throughput(results: Results) -> str:
    rows = [
        [
            t.path,
            t.op,
            fmt_size(t.size),
            t.mode,
            str(t.batch),
            fmt_spread(t.gbps, "GB/s"),
            fmt_spread(t.ops_per_s, "ops/s"),
            str(t.ops),
            _reps(t.gbps),
        ]
        for t in results.throughput
    ]
    return f"== throughput (median (min-max) of `reps` repetitions, `keys` moved in each; {_OP_NOTE}) ==\n" + table(
        ["path", "op", "size", "mode", "batch", "GB/s", "ops/s", "keys", "reps"], rows
    )


def _latency(results: Results) -> str:
    rows = [
        [
            lat.path,
            lat.op,
            fmt_size(lat.size),
            fmt_spread(lat.p50_us, "us"),
            fmt_spread(lat.p99_us, "us"),
            str(lat.ops),
            _reps(lat.p50_us),
        ]
        for lat in results.latency
    ]
    return f"== latency per call ({_OP_NOTE}) ==\n" + table(
        ["path", "op", "size", "p50 us", "p99 us", "calls", "reps"], rows
    )


def _cpu(results: Results) -> str:
    rows = [[c.path, c.op, fmt_size(c.size), fmt_spread(c.us_per_op, "us"), c.processes] for c in results.server_cpu]
    return "== server CPU per call (user + system, of the processes named) ==\n" + table(
        ["path", "op", "size", "us/call", "processes"], rows, right=[False, False, True, True, False]
    )


def _prefix(results: Results) -> str:
    rows = [
        [
            p.path,
            str(p.batch),
            str(p.calls),
            fmt_spread(p.keys_per_s, "keys/s"),
            f"{sorted(p.seconds)[len(p.seconds) // 2] / p.calls * 1e3:.2f}",
        ]
        for p in results.prefix
    ]
    return "== match_prefix (all keys present) ==\n" + table(["path", "batch", "calls", "keys/s", "ms/call"], rows)


def _engine(results: Results) -> str:
    rows = []
    for e in results.engine:
        ttft = (
            f"{fmt_spread(e.ttft_load_s.scaled(1e3), 'us')} vs {fmt_spread(e.ttft_recompute_s.scaled(1e3), 'us')}"
            if e.ttft_load_s is not None and e.ttft_recompute_s is not None
            else "-"
        )
        rows.append(
            [
                e.what,
                str(e.prompt_tokens),
                f"{e.nbytes / 2**20:.1f}",
                fmt_spread(e.load_gbps, "GB/s"),
                fmt_spread(e.raw_gbps, "GB/s"),
                ttft,
            ]
        )
    return "== engine KV loads (the engine's own path vs raw get_many_into of the same bytes) ==\n" + table(
        ["what", "tokens", "MiB", "load GB/s", "raw GB/s", "decode TTFT ms: load vs recompute"], rows
    )


def _meta_memory(results: Results) -> str:
    rows = [
        [str(m.blocks), f"{m.rss_growth / 2**20:.1f}", f"{m.bytes_per_block:.0f}", f"{m.seconds:.1f}"]
        for m in results.meta_memory
    ]
    return "== metadata memory (MetaStore in a fresh process) ==\n" + table(
        ["blocks", "RSS growth MiB", "B/block", "build s"], rows
    )


def render_targets(results: Results) -> str:
    checks, missing = targets.judge(results)
    parts = []
    if checks:
        rows = [
            [
                c.name,
                f"{fmt_spread(c.value, c.unit)} {c.unit}",
                c.reference_text,
                f"{'>=' if c.higher_is_better else '<='} {c.need:g}",
                fmt_spread(c.ratio, "x"),
                "met" if c.met else "NOT MET",
            ]
            for c in checks
        ]
        parts.append(
            "== targets (ratio = value / reference median, per repetition: median (min-max); judged on the median) ==\n"
            + table(
                ["target", "value", "reference (this run)", "need", "ratio", "result"],
                rows,
                right=[False, True, False, True, True, False],
            )
        )
    if missing:
        parts.append("== targets not judged in this run ==\n" + "\n".join(f"{m.name}: {m.reason}" for m in missing))
    return "\n\n".join(parts)


def render(results: Results, comparison: Callable[[Results], str] | None = None) -> str:
    """The report; `comparison` renders the peers measured beside kvstore (the peer plug-in's,
    kvstore.bench.plugin), shown after kvstore's own sections."""
    parts: list[str] = []
    for present, section in (
        (results.ceilings, _ceilings),
        (results.throughput, _throughput),
        (results.latency, _latency),
        (results.server_cpu, _cpu),
        (results.prefix, _prefix),
        (results.engine, _engine),
        (results.meta_memory, _meta_memory),
    ):
        if present:
            parts.append(section(results))
    if results.baselines and comparison is not None:
        parts.append(comparison(results))
    for tier_result in results.tiers:
        from kvstore.bench import tiers

        parts.append(tiers.report(tier_result))
    if results.skipped:
        parts.append("== skipped ==\n" + "\n".join(f"{s.what}: {s.reason}" for s in results.skipped))
    judged = render_targets(results)
    if judged:
        parts.append(judged)
    return "\n\n".join(parts)
