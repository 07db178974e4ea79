"""Number and table formatting shared by the bench's report, its comparisons and its peers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.bench.results import Spread


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


def fmt_value(x: float, unit: str) -> str:
    """A value in its unit's usual precision."""
    if unit == "GB/s":
        return f"{x:.3f}" if x < 10 else f"{x:.2f}"
    if unit in ("us", "B/block"):
        return f"{x:.0f}" if x >= 10 else f"{x:.1f}"
    if unit == "x":
        return f"{x:.2f}"
    if unit == "s":
        return f"{x:.3f}"
    return fmt_rate(x)


def fmt_spread(s: Spread, unit: str, fmt: Callable[[float, str], str] = fmt_value) -> str:
    """ "median (min-max)", or the one value of a single repetition."""
    if s.n == 1:
        return fmt(s.median, unit)
    return f"{fmt(s.median, unit)} ({fmt(s.min, unit)}-{fmt(s.max, unit)})"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    right = right or [False] + [True] * (len(headers) - 1)
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if r else str(c).ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])
