"""The demo's PNG: per workload and scenario, the distribution of time per output token (every gap
between two tokens: where a prefill sharing the batch shows up), and goodput against request rate
on the mixed workload."""

from __future__ import annotations

from benchmarks.demo.goodput import SLO, summarize
from benchmarks.demo.loadgen import Run

COLORS = {"colocated": "tab:red", "pd": "tab:blue", "hybrid": "tab:green", "pd-failures": "tab:gray"}


def plot(
    runs: dict[tuple[str, str, float], Run],
    rates: dict[str, float],
    slo: SLO,
    serial: tuple[Run, Run] | None,
    path: str,
) -> None:
    """Write the PNG to `path` (matplotlib, headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    workloads = list(dict.fromkeys(w for w, _, _ in runs))
    panels = len(workloads) + 1 + (serial is not None)
    cols = min(3, panels)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, workload in zip(flat, workloads):
        for (w, scenario, rate), run in runs.items():
            if w != workload or rate != rates[w]:
                continue
            gaps = sorted(g * 1e3 for o in run.outcomes if o.ok and o.record for g in o.record.itl_s)
            if gaps:
                s = summarize(run, slo)
                ax.step(
                    gaps,
                    [(i + 1) / len(gaps) for i in range(len(gaps))],
                    where="post",
                    color=COLORS.get(scenario),
                    label=f"{scenario}: TPOT p99 {s.tpot_p99 * 1e3:.0f} ms, {s.shared_share:.0%} steps with prefill",
                )
        ax.axvline(slo.tpot_s * 1e3, color="k", ls=":", lw=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("time per output token, each token (ms, log)")
        ax.set_ylabel("fraction of tokens")
        ax.set_title(f"{workload} at {rates[workload]:g} req/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    ax = flat[len(workloads)]
    for scenario in dict.fromkeys(sc for w, sc, _ in runs if w == "mixed"):
        points = sorted(
            (rate, summarize(run, slo).goodput)
            for (w, sc, rate), run in runs.items()
            if w == "mixed" and sc == scenario
        )
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=COLORS.get(scenario), label=scenario)
    ax.set_xlabel("offered load (req/s)")
    ax.set_ylabel("goodput (req/s within both SLOs)")
    ax.set_title(f"mixed: goodput, TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s * 1e3:g} ms")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if serial is not None:
        ax = flat[len(workloads) + 1]
        values = [summarize(r, slo).throughput for r in serial]
        ax.bar(["continuous batching", "one at a time"], values, color=["tab:green", "tab:gray"])
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"code-like burst of {len(serial[0].outcomes)}: {values[0] / values[1]:.1f}x")
    for ax in flat[panels:]:
        ax.axis("off")
    fig.suptitle("kvstore demo: reference engine with continuous batching; colocated vs PD vs hybrid")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
