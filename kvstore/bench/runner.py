"""Runs the bench: options, the section registry, and the store under test.

A section is one kind of measurement registered by name in SECTIONS, run in registration order;
those with `needs_store` run while the store is up (started here unless --meta names one). Each
measured path is a (label, KVTarget) pair from `Context.paths()`: today one kvstore client per
transport. `--compare mooncake` adds the "mooncake" section: Mooncake Store measured by the same
code in processes of its own (kvstore.bench.mooncake), after kvstore's servers are stopped, and
kvstore's "mooncake"/"ucx" transports where installed.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from kvstore.bench import ceilings, compare, latency, metamem, store
from kvstore.bench.procs import LocalStore
from kvstore.bench.report import MEMCPY_CEILING_SIZE, fmt_size, render, targets
from kvstore.bench.results import Baseline, Results, Skipped, to_json
from kvstore.bench.store import KVTarget, ThroughputPlan
from kvstore.config import ClientConfig, parse_size
from kvstore.errors import KVStoreError

LATENCY_SIZE = 4 << 10
PREFIX_BATCH = 1000
SOCKET_SIZES = (1 << 20, 16 << 20)
DEFAULT_TRANSPORTS = ("shm", "tcp")
COMPARE_TRANSPORTS = ("mooncake", "ucx")    # measured too with --compare, where installed
DAEMON_DEFAULT_TRANSPORTS = ("shm", "tcp")  # what the daemon serves without --transports
OPT_IN_SECTIONS = {"mooncake": "mooncake"}  # section -> the --compare choice that runs it


@dataclass(frozen=True)
class BenchOptions:
    meta: str | None
    quick: bool
    transports: tuple[str, ...]
    sizes: tuple[int, ...]
    meta_blocks: int
    json_path: str | None
    dram: int
    segment_size: int
    sections: tuple[str, ...]
    compare: tuple[str, ...] = ()
    not_measured: tuple[Skipped, ...] = ()     # transports --compare would add but cannot, and why
    tiers_dir: str | None = None               # --tiers: where the SSD tier and raw disk are measured
    tiers_size: int = 512 << 20

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTIONS)
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
        if not self.transports or not self.sizes or self.meta_blocks < 1:
            raise ValueError("need at least one transport, one size and one metadata block")

    @property
    def plan(self) -> ThroughputPlan:
        if self.quick:
            return ThroughputPlan(phase_bytes=32 << 20, max_single_ops=40, max_rounds=6, time_cap_s=1.0, repeats=1)
        return ThroughputPlan()

    @property
    def latency_ops(self) -> tuple[int, int]:
        """(timed calls, warm-up calls) per operation."""
        return (100, 10) if self.quick else (500, 50)

    @property
    def prefix_calls(self) -> int:
        return 5 if self.quick else 20

    @property
    def socket_round_bytes(self) -> int:
        return (64 if self.quick else 256) << 20


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """BenchOptions from the `kvstore bench` flags; ValueError or KVStoreError if one is bad."""
    from kvstore.transport import registry

    quick = bool(args.quick)
    default_sizes = "4KiB,1MiB" if quick else "4KiB,64KiB,1MiB,16MiB"
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip()) if args.sections else None
    compare = tuple(sorted({c for c in [getattr(args, "compare", None)] if c}
                           | {OPT_IN_SECTIONS[s] for s in sections or () if s in OPT_IN_SECTIONS}))
    if sections is None:
        sections = tuple(s for s in SECTIONS if s != "tiers"
                         and (s not in OPT_IN_SECTIONS or OPT_IN_SECTIONS[s] in compare))
    if getattr(args, "tiers", False) and "tiers" not in sections:
        sections += ("tiers",)
    not_measured: list[Skipped] = []
    if args.transports:
        transports = tuple(t.strip() for t in args.transports.split(",") if t.strip())
        for name in transports:
            registry.client_class(name)     # an unknown or uninstalled transport fails here, not mid-run
    else:
        transports = DEFAULT_TRANSPORTS
        if compare:
            extra, not_measured = available_transports(COMPARE_TRANSPORTS)
            transports += extra
    return BenchOptions(
        tiers_dir=getattr(args, "tiers_dir", None),
        tiers_size=parse_size(getattr(args, "tiers_size", None) or "512MiB") // (4 if quick else 1),
        meta=args.meta, quick=quick, transports=transports,
        sizes=tuple(_size(s) for s in (args.sizes or default_sizes).split(",") if s.strip()),
        meta_blocks=args.meta_blocks or (100_000 if quick else 1_000_000),
        json_path=args.json, dram=parse_size(args.dram), segment_size=parse_size(args.segment_size),
        sections=sections, compare=compare, not_measured=tuple(not_measured))


def available_transports(names: tuple[str, ...]) -> tuple[tuple[str, ...], list[Skipped]]:
    """Those of `names` that are registered and whose modules import (client and server side);
    a Skipped saying why for each other one."""
    from kvstore.transport import registry

    usable, missing = [], []
    for name in names:
        if name not in registry.names():
            missing.append(Skipped(f"kvstore over {name}", "not measured: no such transport registered yet"))
            continue
        try:
            registry.client_class(name)
            registry.server_class(name)
        except (KVStoreError, ImportError) as exc:
            cause = exc.__cause__
            if isinstance(cause, ModuleNotFoundError) and (cause.name or "").startswith("kvstore."):
                reason = f"not measured: its module {cause.name} does not exist yet"
            else:
                reason = f"not measured: {exc}"
            missing.append(Skipped(f"kvstore over {name}", reason))
            continue
        usable.append(name)
    return tuple(usable), missing


def _size(text: str) -> int:
    try:
        size = parse_size(text)
    except ValueError:
        raise ValueError(f"bad block size {text!r}; use e.g. 4KiB, 1MiB") from None
    if size <= 0:
        raise ValueError(f"block size {text!r} must be positive")
    return size


class Context:
    """What sections share: the options, the results so far, and clients of the store under test."""

    def __init__(self, options: BenchOptions, results: Results) -> None:
        self.options = options
        self.results = results
        self.meta_address: str | None = None
        self.run_id = secrets.token_hex(4)       # keeps this run's keys apart in a shared store
        self.transports = list(options.transports)   # less any the started daemon could not serve
        self._clients: dict[str, KVTarget] = {}

    def paths(self) -> Iterator[tuple[str, KVTarget]]:
        """(label, target) for every path measured: one kvstore client per transport."""
        from kvstore.client import KVClient

        assert self.meta_address, "a store section ran without a store"
        for transport in self.transports:
            if transport not in self._clients:
                self._clients[transport] = KVClient(self.meta_address, ClientConfig(transports=(transport,)))
            yield transport, self._clients[transport]

    def key_prefix(self, *parts: object) -> str:
        return "/".join(["bench", self.run_id, *map(str, parts)])

    def close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


@dataclass(frozen=True)
class Section:
    name: str
    needs_store: bool
    run: Callable[[Context], None]


SECTIONS: dict[str, Section] = {}


def section(name: str, needs_store: bool) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        SECTIONS[name] = Section(name, needs_store, fn)
        return fn
    return register


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


@section("ceilings", needs_store=False)
def run_ceilings(ctx: Context) -> None:
    opts = ctx.options
    for size in (MEMCPY_CEILING_SIZE, 16 << 20):
        progress(f"memcpy {fmt_size(size)}")
        ctx.results.ceilings.append(ceilings.memcpy(size))
    socket_sizes = sorted(set(SOCKET_SIZES) | {s for s in opts.sizes if s >= 1 << 20 and "tcp" in opts.transports})
    for request_reply in (False, True):
        for size in socket_sizes:
            progress(f"raw tcp socket {fmt_size(size)}{' request/reply' if request_reply else ''}")
            ctx.results.ceilings.append(ceilings.tcp_socket(size, round_bytes=opts.socket_round_bytes,
                                                            request_reply=request_reply))


def _attempt(ctx: Context, what: str, measure: Callable[..., None], *args: Any) -> None:
    """measure(*args); a store error (e.g. shm to a store on another host, a block larger than its
    segments) skips that measurement, with the reason in the report."""
    progress(what)
    try:
        measure(*args)
    except KVStoreError as exc:
        ctx.results.skipped.append(Skipped(what, f"{type(exc).__name__}: {exc}"))
        progress(f"{what} skipped: {exc}")


def _throughput(ctx: Context, path: str, target: KVTarget, size: int) -> None:
    plan = ctx.options.plan
    prefix = ctx.key_prefix("tput", path, size)
    for measure in (store.measure_single, store.measure_batched):
        ctx.results.throughput.extend(store.best_of(
            plan.repeats, lambda r: measure(target, path, size, plan, f"{prefix}/{r}")))


@section("throughput", needs_store=True)
def run_throughput(ctx: Context) -> None:
    for path, target in ctx.paths():
        for size in ctx.options.sizes:
            _attempt(ctx, f"throughput {path} {fmt_size(size)}", _throughput, ctx, path, target, size)


def _latency(ctx: Context, path: str, target: KVTarget) -> None:
    ops, warmup = ctx.options.latency_ops
    ctx.results.latency.extend(latency.measure_latency(target, path, LATENCY_SIZE, ops, warmup,
                                                       ctx.key_prefix("lat", path)))


@section("latency", needs_store=True)
def run_latency(ctx: Context) -> None:
    for path, target in ctx.paths():
        _attempt(ctx, f"latency {path}", _latency, ctx, path, target)


def _prefix(ctx: Context, target: KVTarget) -> None:
    ctx.results.prefix.append(latency.measure_prefix(target, PREFIX_BATCH, ctx.options.prefix_calls,
                                                     ctx.key_prefix("prefix"), ctx.options.plan.repeats))


@section("prefix", needs_store=True)
def run_prefix(ctx: Context) -> None:
    _, target = next(ctx.paths())      # metadata only: any path will do
    _attempt(ctx, f"match_prefix on {PREFIX_BATCH}-key batches", _prefix, ctx, target)


@section("mooncake", needs_store=False)
def run_mooncake(ctx: Context) -> None:
    """Mooncake Store, measured like kvstore: same sizes, plan, latency and prefix counts."""
    from kvstore.bench import mooncake

    opts = ctx.options
    ops, warmup = opts.latency_ops
    spec = mooncake.MooncakeSpec(sizes=opts.sizes, plan=opts.plan, latency_size=LATENCY_SIZE, latency_ops=ops,
                                 latency_warmup=warmup, prefix_batch=PREFIX_BATCH, prefix_calls=opts.prefix_calls,
                                 segment_size=opts.dram, key_prefix=ctx.key_prefix("mooncake"))
    progress(f"{mooncake.PATH}: starting mooncake_master, a server ({fmt_size(spec.segment_size)} segment) "
             "and a client")
    outcome = mooncake.MooncakeStore(spec, progress).measure()
    res = ctx.results
    res.throughput += outcome.throughput
    res.latency += outcome.latency
    res.prefix += outcome.prefix
    res.skipped += outcome.skipped
    setup = mooncake.describe(spec) + "".join(f"; {note}" for note in outcome.notes)
    res.baselines.append(Baseline("mooncake", mooncake.PATH, setup, outcome.unavailable, outcome.seconds))
    if outcome.unavailable:
        res.skipped.append(Skipped("mooncake", f"unavailable: {outcome.unavailable}"))
        progress(f"mooncake: unavailable: {outcome.unavailable}")


@section("tiers", needs_store=False)
def run_tiers(ctx: Context) -> None:
    """The SSD tier against the raw disk, with a store of its own (an SSD tier, demoting all)."""
    from kvstore.bench import tiers

    block = 16 << 20 if ctx.options.tiers_size >= 64 << 20 else 1 << 20
    transports = tuple(t for t in ctx.transports if t in ("shm", "tcp"))
    ctx.results.tiers.append(tiers.measure_tiers(ctx.options.tiers_dir, ctx.options.tiers_size, block,
                                                 transports, progress))


@section("metamem", needs_store=False)
def run_metamem(ctx: Context) -> None:
    progress(f"metadata memory at {ctx.options.meta_blocks} blocks")
    ctx.results.meta_memory.append(metamem.measure_in_subprocess(ctx.options.meta_blocks))


def run(options: BenchOptions) -> tuple[Results, bool]:
    """Run the chosen sections; returns the results and whether every section ran to the end."""
    results = Results(skipped=list(options.not_measured))
    ctx = Context(options, results)
    chosen = [SECTIONS[name] for name in SECTIONS if name in options.sections]
    last_store_use = max((i for i, s in enumerate(chosen) if s.needs_store), default=-1)
    local: LocalStore | None = None
    ok = True
    try:
        for i, sec in enumerate(chosen):
            if sec.needs_store and ctx.meta_address is None:
                if options.meta:
                    ctx.meta_address = options.meta
                else:
                    local = _start_store(ctx)
                    ctx.meta_address = local.meta_address
            t0 = time.perf_counter()
            try:
                sec.run(ctx)
            except Exception as exc:   # one broken section must not lose the others' results
                ok = False
                traceback.print_exc(file=sys.stderr)
                results.skipped.append(Skipped(sec.name, f"failed: {type(exc).__name__}: {exc}"))
            progress(f"{sec.name} took {time.perf_counter() - t0:.1f} s")
            if i == last_store_use:    # stop the servers before measuring without them
                ctx.close_clients()
                if local is not None:
                    local.close()
                    local = None
    finally:
        ctx.close_clients()
        if local is not None:
            local.close()
    return results, ok


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


def main(args: argparse.Namespace) -> int:
    try:
        options = options_from_args(args)
    except (ValueError, KVStoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    results, ok = run(options)
    print(render(results), flush=True)
    print(f"\nbench finished in {time.perf_counter() - started:.0f} s", flush=True)
    if options.json_path:
        doc = {"options": asdict(options), "results": to_json(results), "targets": to_json(targets(results))}
        if results.baselines:
            doc["comparison"] = {"rows": to_json(compare.comparison(results)),
                                 "not_judged": compare.unjudged(results)}
        with open(options.json_path, "w") as fh:
            json.dump(doc, fh, indent=2)
    return 0 if ok else 1
