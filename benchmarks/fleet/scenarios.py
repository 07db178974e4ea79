"""The fault scenarios of tests/fleet/scenarios.py, measured: each played with several seeds on a
fresh fleet (hosts in network namespaces: needs root, docs/fleet.md), then per scenario the
min / median / max of

    fault->put      seconds from the fault in place to the first acknowledged put invoked after it
    heal->service   seconds from the heal to full service (one leader, the other standing by,
                    writes open, every daemon mounted, and the last error but KeyNotFound)
    lost            acknowledged puts not read back (must be 0)
    violations      the checker's violations of any kind (must be 0)
    stale reads     reads answered by a service after another was elected over it, or completed
                    on its grant past the grant's lifetime (must be 0)
    startup         seconds to start the fleet (6 hosts, Redis, the HA pair, 2 daemons)

    python -m benchmarks.fleet.scenarios --seeds 3                 # every scenario, seeds 1-3
    python -m benchmarks.fleet.scenarios --only leader-from-redis  # one (or more) of them
    python -m benchmarks.fleet.scenarios --soak 30                 # back to back for 30 minutes

A soak plays the scenarios in turn with seeds 1, 2, 3... until the minutes are up and stops at
the first run with a violation (its files are copied to --keep). It leaves out the scenarios
with a known bug (Scenario.bug) unless --only names them; their violations never fail a run.
The exit status is 1 if any other run lost a put or broke a property. Not a test: minutes long,
and it prints timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.fleet.netns import Fleet, missing
from tests.cluster import ADMIN_TOKEN
from tests.fleet import faults, scenarios
from tests.fleet.scenarios import Measures


def once(name: str, seed: int, keep: Path | None) -> Measures:
    tmp = Path(tempfile.mkdtemp(prefix=f"kvfleet-{name}-{seed}-"))
    try:
        with Fleet() as net:
            measures = scenarios.play(faults.BY_NAME[name], net, tmp, seed)
        bad = measures.report.violations or measures.evictions
        if bad and keep is not None:
            shutil.copytree(tmp, keep / f"{name}-{seed}", dirs_exist_ok=True)
        return measures
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _row(name: str, values: Sequence[float], unit: str = "") -> str:
    if not values:
        return f"{name:<14} -"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    fmt = "{:.2f}" if unit else "{:.0f}"
    return f"{name:<14} " + " / ".join(fmt.format(v) for v in (lo, mid, hi)) + unit


def report(name: str, ms: list[Measures]) -> str:
    lines = [f"{name} ({len(ms)} seeds: min / median / max)"]
    lines.append("  " + _row("fault->put", [m.fault_to_put_s for m in ms], " s"))
    lines.append("  " + _row("heal->service", [m.heal_to_service_s for m in ms], " s"))
    lines.append("  " + _row("lost", [m.report.lost for m in ms]))
    lines.append("  " + _row("violations", [len(m.report.violations) for m in ms]))
    lines.append("  " + _row("stale reads", [m.report.stale_reads for m in ms]))
    lines.append("  " + _row("startup", [m.startup_s for m in ms], " s"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet.scenarios", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3, help="seeds per scenario (1..N)")
    p.add_argument("--only", nargs="*", default=[], help=f"scenarios, of: {', '.join(faults.BY_NAME)}")
    p.add_argument("--soak", type=float, default=0.0, help="play back to back for this many minutes")
    p.add_argument("--keep", type=Path, default=Path(tempfile.gettempdir()) / "kvfleet-failures",
                   help="where the files of a run that broke a property go")  # fmt: skip
    args = p.parse_args(argv)
    reason = missing()
    if reason is not None:
        print(f"cannot run a fleet here: {reason}", file=sys.stderr)
        return 2
    os.environ.setdefault("KVSTORE_TOKEN", ADMIN_TOKEN)
    known = [n for n, sc in faults.BY_NAME.items() if sc.bug]
    # A soak looks for new trouble: the scenarios with a known bug only when named.
    names = args.only or [n for n in faults.BY_NAME if not (args.soak and n in known)]
    unknown = [n for n in names if n not in faults.BY_NAME]
    if unknown:
        p.error(f"no scenario {unknown}; there are {list(faults.BY_NAME)}")
    results: dict[str, list[Measures]] = {n: [] for n in names}
    failed = 0

    def play(name: str, seed: int) -> bool:
        """One run, printed; True if it broke a property its scenario is not known to break."""
        m = once(name, seed, None if name in known else args.keep)
        results[name].append(m)
        print(m.line(), flush=True)
        bad = bool(m.report.violations or m.evictions)
        if bad and name not in known:
            print(m.report.summary(), flush=True)
        return bad and name not in known

    if args.soak:
        deadline, seed = time.monotonic() + args.soak * 60, 1
        while time.monotonic() < deadline and not failed:
            for name in names:
                if time.monotonic() >= deadline or failed:
                    break
                failed += play(name, seed)
            seed += 1
    else:
        for name in names:
            for seed in range(1, args.seeds + 1):
                failed += play(name, seed)
    print()
    for name in names:
        if results[name]:
            print(report(name, results[name]) + (f"\n  known bug: {faults.BY_NAME[name].bug}" if name in known else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
