"""Runs the bench: the chosen sections in order, the store under test started for those that
need it (unless --meta names one) and stopped before the others (peers are measured without
kvstore's servers running), then the report and the JSON document. With --compare, the peers come
from the repository's peer plug-in (kvstore.bench.plugin)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from dataclasses import asdict

from kvstore.bench import plugin, targets
from kvstore.bench import sections as _sections  # noqa: F401 - importing it registers the sections
from kvstore.bench.context import SECTIONS, Context, progress
from kvstore.bench.fmt import fmt_size
from kvstore.bench.options import BenchOptions, options_from_args
from kvstore.bench.procs import LocalStore
from kvstore.bench.report import render
from kvstore.bench.results import Results, Skipped, to_json
from kvstore.bench.trace import command as trace_command

DAEMON_DEFAULT_TRANSPORTS = ("shm", "tcp")  # what the daemon serves without --transports


def run(options: BenchOptions) -> tuple[Results, bool]:
    """Run the chosen sections; returns the results and whether every section ran to the end."""
    results = Results(skipped=list(options.not_measured))
    ctx = Context(options, results)
    chosen = [SECTIONS[name] for name in options.sections]
    last_store_use = max((i for i, s in enumerate(chosen) if s.needs_store), default=-1)
    ok = True
    try:
        for i, sec in enumerate(chosen):
            progress(f"== section {sec.name} ({i + 1} of {len(chosen)}) ==")
            if sec.needs_store and ctx.meta_address is None:
                if options.meta:
                    ctx.meta_address = options.meta
                else:
                    ctx.store = _start_store(ctx)
                    ctx.meta_address = ctx.store.meta_address
            t0 = time.perf_counter()
            try:
                sec.run(ctx)
            except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others' results
                ok = False
                traceback.print_exc(file=sys.stderr)
                results.skipped.append(Skipped(sec.name, f"failed: {type(exc).__name__}: {exc}"))
            progress(f"{sec.name} took {time.perf_counter() - t0:.1f} s")
            if i == last_store_use:  # stop the servers before measuring without them
                _stop_store(ctx)
    finally:
        _stop_store(ctx)
    return results, ok


def _stop_store(ctx: Context) -> None:
    ctx.close_clients()
    if ctx.store is not None:
        ctx.store.close()
        ctx.store = None


def _start_store(ctx: Context) -> LocalStore:
    """Meta + a daemon serving every transport measured. If a transport beyond the daemon's
    defaults keeps it from starting (e.g. mooncake's engine fails), start without those and
    record why, so the rest of the run still measures shm and tcp."""
    opts = ctx.options
    served = tuple(dict.fromkeys([*DAEMON_DEFAULT_TRANSPORTS, *ctx.transports]))
    progress(f"starting meta + daemon ({fmt_size(opts.dram)} DRAM, transports {','.join(served)})")
    try:
        return LocalStore(opts.dram, opts.segment_size, daemon_args=("--transports", ",".join(served))).start()
    except RuntimeError as exc:
        extra = [t for t in served if t not in DAEMON_DEFAULT_TRANSPORTS]
        if not extra:
            raise
        reason = str(exc).strip().splitlines()[-1][:300]
        progress(f"daemon failed with {','.join(extra)}; retrying without them: {reason}")
        for name in extra:
            ctx.results.skipped.append(Skipped(f"kvstore over {name}", f"daemon would not start with it: {reason}"))
        ctx.transports = [t for t in ctx.transports if t not in extra]
        return LocalStore(opts.dram, opts.segment_size).start()


def document(options: BenchOptions, results: Results) -> dict[str, object]:
    """The run as one JSON document: options, results, targets (judged and not), comparisons."""
    checks, missing = targets.judge(results)
    doc: dict[str, object] = {
        "options": asdict(options),
        "results": to_json(results),
        "targets": to_json(checks),
        "not_judged": [asdict(m) for m in missing],
    }
    comparison = plugin.comparison()
    if results.baselines and comparison is not None:
        doc["comparison"] = comparison.document(results)
    return doc


def main(args: argparse.Namespace) -> int:
    from kvstore.errors import KVStoreError

    if getattr(args, "bench_form", None) == "trace":  # `kvstore bench trace FILE`
        return trace_command.main(args)
    try:
        options = options_from_args(args)
        if options.compare:
            plugin.load(options.compare)  # the peers: the repository's plug-in, registering them
    except (ValueError, KVStoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    results, ok = run(options)
    comparison = plugin.comparison()
    print(render(results, comparison.render if comparison else None), flush=True)
    print(f"\nbench finished in {time.perf_counter() - started:.0f} s", flush=True)
    if options.json_path:
        with open(options.json_path, "w") as fh:
            json.dump(document(options, results), fh, indent=2)
    return 0 if ok else 1
