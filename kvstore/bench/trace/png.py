"""The replay's PNG (matplotlib, headless): hit rate over trace time per capacity, and hit rate
against capacity, kvstore beside the exact LRU and the infinite bound."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.bench.trace.results import PointResult


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot(points: Sequence[PointResult], title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (over_time, vs_capacity) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, p in enumerate(points):
        color = colors[i % len(colors)]
        t = [(w.start_s + w.end_s) / 2 / 60 for w in p.timeline]
        label = f"{p.capacity_tokens / 1e6:g}M tokens"
        over_time.plot(t, [w.hit.store for w in p.timeline], color=color, label=f"kvstore {label}")
        over_time.plot(t, [w.hit.lru for w in p.timeline], color=color, ls="--", label=f"LRU {label}")
    if points:
        first = points[0].timeline
        over_time.plot(
            [(w.start_s + w.end_s) / 2 / 60 for w in first], [w.hit.infinite for w in first], "k:", label="infinite"
        )
    over_time.set_xlabel("trace time (min)")
    over_time.set_ylabel("hit rate (prompt tokens)")
    over_time.set_ylim(0, 1)
    over_time.grid(True, alpha=0.3)
    over_time.legend(fontsize=7)
    caps = [p.capacity_tokens / 1e6 for p in points]
    vs_capacity.plot(caps, [p.hit.store for p in points], "o-", label="kvstore")
    vs_capacity.plot(caps, [p.hit.lru for p in points], "s--", label="exact LRU")
    vs_capacity.plot(caps, [p.hit.infinite for p in points], "k:", label="infinite")
    vs_capacity.set_xscale("log")
    vs_capacity.set_xlabel("capacity (M tokens)")
    vs_capacity.set_ylim(0, 1)
    vs_capacity.grid(True, alpha=0.3)
    vs_capacity.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
