"""The human-readable report, and the issue targets each result is judged against.

A missed target is reported, never raised: the bench is a measurement, not a test.
"""

from __future__ import annotations

from typing import Sequence

from kvstore.bench import compare
from kvstore.bench.results import Results, TargetCheck

MEMCPY_CEILING_SIZE = 256 << 20
SHM_GET_OF_MEMCPY = 0.6          # shm get >= 0.6 x memcpy (256 MiB), for blocks >= 1 MiB
TCP_GET_OF_SOCKET = 0.8          # tcp get >= 0.8 x raw loopback socket at the same block size
MATCH_PREFIX_KEYS_PER_S = 150_000
META_BYTES_PER_BLOCK = 300
LARGE_BLOCK = 1 << 20


def fmt_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def fmt_rate(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f} M"
    if x >= 1e3:
        return f"{x / 1e3:.1f} k"
    return f"{x:.0f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    right = right or [False] + [True] * (len(headers) - 1)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if r else str(c).ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def targets(results: Results) -> list[TargetCheck]:
    """Every issue target the results can be judged against (a missing ceiling skips its target)."""
    checks: list[TargetCheck] = []
    memcpy = results.ceiling("memcpy", MEMCPY_CEILING_SIZE)
    for t in results.throughput:
        if t.op != "get":
            continue
        if t.path == "shm" and t.size >= LARGE_BLOCK and memcpy:
            checks.append(TargetCheck(f"shm get {fmt_size(t.size)} {t.mode}", t.gbps, "GB/s", memcpy.gbps,
                                      f"{SHM_GET_OF_MEMCPY} x memcpy {fmt_size(memcpy.size)} {memcpy.gbps:.2f} GB/s",
                                      SHM_GET_OF_MEMCPY))
        sock = results.ceiling("tcp socket", t.size)
        if t.path == "tcp" and sock:
            checks.append(TargetCheck(f"tcp get {fmt_size(t.size)} {t.mode}", t.gbps, "GB/s", sock.gbps,
                                      f"{TCP_GET_OF_SOCKET} x socket {fmt_size(t.size)} {sock.gbps:.2f} GB/s",
                                      TCP_GET_OF_SOCKET))
    for p in (p for p in results.prefix if p.path == compare.KVSTORE_PREFIX_PATH):
        checks.append(TargetCheck(f"match_prefix {p.batch} keys", p.keys_per_s, "keys/s", MATCH_PREFIX_KEYS_PER_S,
                                  f">= {fmt_rate(MATCH_PREFIX_KEYS_PER_S)} keys/s", 1.0))
    for m in results.meta_memory:
        checks.append(TargetCheck(f"metadata at {fmt_rate(m.blocks)} blocks", m.bytes_per_block, "B/block",
                                  META_BYTES_PER_BLOCK, f"<= {META_BYTES_PER_BLOCK} B/block", 1.0,
                                  higher_is_better=False))
    return checks + compare.targets(results)


def render(results: Results) -> str:
    parts: list[str] = []
    if results.ceilings:
        parts.append("== ceilings (this run) ==\n" + table(
            ["what", "size", "GB/s"],
            [[c.name, fmt_size(c.size), f"{c.gbps:.2f}"] for c in results.ceilings]))
    if results.throughput:
        parts.append("== throughput (fastest of `runs` runs; `keys` moved per run) ==\n" + table(
            ["path", "op", "size", "mode", "batch", "GB/s", "ops/s", "keys", "runs"],
            [[t.path, t.op, fmt_size(t.size), t.mode, str(t.batch), f"{t.gbps:.3f}", fmt_rate(t.ops_per_s),
              str(t.ops), str(t.repeats)] for t in results.throughput]))
    if results.latency:
        parts.append("== latency ==\n" + table(
            ["path", "op", "size", "p50 us", "p99 us", "calls"],
            [[lat.path, lat.op, fmt_size(lat.size), f"{lat.p50_us:.0f}", f"{lat.p99_us:.0f}", str(lat.ops)]
             for lat in results.latency]))
    if results.prefix:
        parts.append("== match_prefix (all keys present; fastest of `runs` runs) ==\n" + table(
            ["path", "batch", "calls", "runs", "keys/s", "ms/call"],
            [[p.path, str(p.batch), str(p.calls), str(p.repeats), fmt_rate(p.keys_per_s),
              f"{p.seconds / p.calls * 1e3:.2f}"] for p in results.prefix]))
    if results.meta_memory:
        parts.append("== metadata memory (MetaStore in a fresh process) ==\n" + table(
            ["blocks", "RSS growth MiB", "B/block", "build s"],
            [[str(m.blocks), f"{m.rss_growth / 2**20:.1f}", f"{m.bytes_per_block:.0f}", f"{m.seconds:.1f}"]
             for m in results.meta_memory]))
    if results.baselines:
        parts.append(render_comparison(results))
    for tier_result in results.tiers:
        from kvstore.bench import tiers

        parts.append(tiers.report(tier_result))
    if results.skipped:
        parts.append("== skipped ==\n" + "\n".join(f"{s.what}: {s.reason}" for s in results.skipped))
    checks = targets(results)
    if checks:
        parts.append("== targets ==\n" + table(
            ["target", "value", "ceiling/target", "ratio", "result"],
            [[c.name, f"{c.value:.3g} {c.unit}" if c.value < 1e4 else f"{fmt_rate(c.value)} {c.unit}",
              c.reference_text, f"{c.ratio:.2f}", "met" if c.met else "NOT MET"] for c in checks],
            right=[False, True, False, True, False]))
    return "\n\n".join(parts)


def _value(x: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{x:.3f}"
    if unit == "us":
        return f"{x:.0f}"
    return fmt_rate(x)


def _ceilings_line(results: Results) -> str:
    by_name: dict[str, list[str]] = {}
    for c in results.ceilings:
        by_name.setdefault(c.name, []).append(f"{fmt_size(c.size)} {c.gbps:.2f}")
    return "; ".join(f"{name} {', '.join(v)} GB/s" for name, v in by_name.items())


def _ratio_cells(row: compare.ComparisonRow, path: str) -> list[str]:
    if path not in row.values:
        return ["-", "-"]
    return [_value(row.values[path], row.unit), f"{row.ratios[path]:.2f}"]


def render_comparison(results: Results) -> str:
    """kvstore beside each baseline: absolute numbers, kvstore / baseline ratios, the ceilings."""
    lines = ["== kvstore vs Mooncake Store (same run; x = kvstore / mooncake-store) =="]
    for b in results.baselines:
        state = f"unavailable: {b.unavailable}" if b.unavailable else f"measured in {b.seconds:.0f} s"
        lines.append(f"{b.name}: {state}\n  {b.setup}")
    base = compare.baseline(results)
    if base is not None:
        rows = compare.comparison(results)
        paths = compare.kvstore_paths(results, base)
        headers = ["what", "size", "mode", "unit", base.path]
        for path in paths:
            headers += [path, "x"]
        body = [[r.what, fmt_size(r.size), r.mode, r.unit, _value(r.baseline, r.unit)]
                + [cell for path in paths for cell in _ratio_cells(r, path)]
                for r in rows if r.what != "prefix match"]
        lines.append(f"{base.path} calls: put_from, get_into, batch_put_from, batch_get_into (buffers registered), "
                     "is_exist (exists), batch_is_exist (match_prefix: the leading keys present)")
        lines.append("throughput (> 1 x: kvstore faster) and latency (< 1 x: kvstore faster), kvstore per transport:")
        lines.append(table(headers, body, right=[False, True, False, False] + [True] * (len(headers) - 4)))
        kv = compare.KVSTORE_PREFIX_PATH
        prefix = [[r.mode, fmt_rate(r.baseline), *_ratio_cells(r, kv)] for r in rows if r.what == "prefix match"]
        if prefix:
            lines.append(f"batched existence, all keys present: {kv} match_prefix vs {base.path} batch_is_exist:")
            lines.append(table(["batch", f"{base.path} keys/s", f"{kv} keys/s", "x"], prefix))
    if results.ceilings:
        lines.append(f"ceilings (this run): {_ceilings_line(results)}")
    lines += [f"not judged: {note}" for note in compare.unjudged(results)]
    return "\n".join(lines)
