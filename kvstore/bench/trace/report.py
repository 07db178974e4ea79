"""A trace replay as text: the tables, and plots of hit rate over trace time and against capacity."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.bench.fmt import table
from kvstore.bench.trace.results import PointResult

PLOT_ROWS = 10
BAR = 40


def tokens(n: int) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return str(n)


def size(n: float) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n:.0f} B"


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def hit_table(points: Sequence[PointResult]) -> str:
    rows = [
        [
            tokens(p.capacity_tokens),
            str(p.capacity_blocks),
            _pct(p.hit.store),
            _pct(p.hit.lru),
            _pct(p.hit.infinite),
            f"{p.hit.store_vs_lru:.3f}",
            f"{p.hit.store_vs_infinite:.3f}",
            f"{p.hit.lru_vs_infinite:.3f}",
            f"{p.evictions}/{p.lru_evictions}",
            f"{size(p.peak_used_bytes)} of {size(p.capacity_bytes)}",
        ]
        for p in points
    ]
    headers = ["capacity", "blocks", "kvstore", "LRU", "infinite", "kv/LRU", "kv/inf", "LRU/inf", "evict kv/LRU"]
    return table([*headers, "peak used"], rows)


def call_table(points: Sequence[PointResult]) -> str:
    rows = []
    for p in points:
        for name, lat in (("lookup", p.lookup), ("load", p.load), ("store", p.store)):
            rows.append(
                [
                    tokens(p.capacity_tokens),
                    name,
                    str(lat.calls),
                    f"{lat.p50_us:.0f}",
                    f"{lat.p99_us:.0f}",
                    f"{lat.mean_us:.0f}",
                ]
            )
    return table(["capacity", "call", "calls", "p50 us", "p99 us", "mean us"], rows)


def pace_table(points: Sequence[PointResult]) -> str:
    rows = []
    for p in points:
        t = p.throughput
        cpu = f"{t.server_cpu_s:.1f}" if t.server_cpu_s is not None else "-"
        rows.append(
            [
                tokens(p.capacity_tokens),
                f"{t.replay_s:.1f}",
                f"{t.requests_per_s:.0f}",
                f"{t.calls_per_s:.0f}",
                _pct(t.store_share),
                _pct(t.own_share),
                f"{t.paced_sleep_s:.1f}",
                f"{t.max_lag_s:.2f}",
                size(p.bytes_loaded),
                size(p.bytes_stored),
                cpu,
            ]
        )
    headers = ["capacity", "replay s", "req/s", "calls/s", "in store", "own work", "paced s", "max lag s"]
    return table([*headers, "loaded", "stored", "server CPU s"], rows)


def capacity_plot(points: Sequence[PointResult]) -> str:
    """Hit rate against capacity: a bar per cache at each point."""
    lines = ["hit rate vs capacity (share of prompt tokens)"]
    for p in points:
        for i, (name, value) in enumerate((("kvstore", p.hit.store), ("LRU", p.hit.lru), ("infinite", p.hit.infinite))):
            label = tokens(p.capacity_tokens) if i == 0 else ""
            filled = round(value * BAR)
            lines.append(f"{label:>6} {name:<8} |{'#' * filled}{' ' * (BAR - filled)}| {_pct(value)}")
    return "\n".join(lines)


def time_plot(point: PointResult) -> str:
    """Hit rate over trace time: i = infinite, L = exact LRU, k = kvstore (drawn in that order)."""
    windows = point.timeline
    if not windows:
        return ""
    grid = [[" "] * len(windows) for _ in range(PLOT_ROWS + 1)]
    for col, w in enumerate(windows):
        for mark, value in (("i", w.hit.infinite), ("L", w.hit.lru), ("k", w.hit.store)):
            grid[PLOT_ROWS - round(value * PLOT_ROWS)][col] = mark
    lines = [f"hit rate over trace time at {tokens(point.capacity_tokens)} tokens (k kvstore, L LRU, i infinite)"]
    for row, cells in enumerate(grid):
        level = (PLOT_ROWS - row) * 100 // PLOT_ROWS
        lines.append(f"{level:>4}% |" + "".join(c * 2 for c in cells))
    lines.append("      +" + "--" * len(windows))
    lines.append(f"       {windows[0].start_s:.0f} s{' ' * max(1, 2 * len(windows) - 12)}{windows[-1].end_s:.0f} s")
    return "\n".join(lines)


def render(points: Sequence[PointResult], header: str) -> str:
    parts = [
        header,
        "== hit rate (prompt tokens) ==",
        hit_table(points),
        "\n== store calls (one lookup, load and store per request) ==",
        call_table(points),
        "\n== replay pace ==",
        pace_table(points),
        "",
        capacity_plot(points),
    ]
    parts += ["\n" + time_plot(p) for p in points]
    problems = [
        f"{tokens(p.capacity_tokens)}: {p.failed_loads} load and {p.failed_puts} store calls failed "
        f"(first: {p.first_error})"
        for p in points
        if p.failed_puts or p.failed_loads
    ]
    problems += [
        f"{tokens(p.capacity_tokens)}: {p.bad_loads} loads returned wrong bytes" for p in points if p.bad_loads
    ]
    if problems:
        parts += ["\n== problems ==", *problems]
    return "\n".join(parts)
