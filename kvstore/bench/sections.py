"""The bench's sections: each one kind of measurement, registered by name (kvstore.bench.context).

Each prints a progress line as it starts and one per measurement; a store error in one
measurement (e.g. shm to a store on another host, a block larger than its segments) skips that
measurement, with the reason in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstore.bench import ceilings, latency, metamem, store
from kvstore.bench.context import Context, KVPath, progress, section
from kvstore.bench.fmt import fmt_size
from kvstore.bench.plugin import PEERS, PeerSpec, peer
from kvstore.bench.results import Baseline, Skipped
from kvstore.errors import KVStoreError

MEMCPY_CEILING_SIZE = 256 << 20
PREFIX_BATCH = 1000
SOCKET_SIZES = (1 << 20, 16 << 20)


def _attempt(ctx: Context, what: str, measure: Callable[..., None], *args: Any) -> None:
    progress(what)
    try:
        measure(*args)
    except KVStoreError as exc:
        ctx.results.skipped.append(Skipped(what, f"{type(exc).__name__}: {exc}"))
        progress(f"{what} skipped: {exc}")


@section("ceilings", needs_store=False)
def run_ceilings(ctx: Context) -> None:
    opts = ctx.options
    repeats = opts.plan.repeats
    for size in (MEMCPY_CEILING_SIZE, 16 << 20, 1 << 20):
        progress(f"memcpy {fmt_size(size)}")
        ctx.results.ceilings.append(ceilings.memcpy(size, repeats))
    socket_sizes = sorted(set(SOCKET_SIZES) | {s for s in opts.sizes if s >= 1 << 20 and "tcp" in opts.transports})
    for request_reply in (False, True):
        for size in socket_sizes:
            progress(f"raw loopback socket {fmt_size(size)}{' request/reply' if request_reply else ''}")
            ctx.results.ceilings.append(
                ceilings.tcp_socket(size, repeats, round_bytes=opts.socket_round_bytes, request_reply=request_reply)
            )


def _throughput(ctx: Context, path: KVPath, size: int) -> None:
    plan, prefix = ctx.options.plan, ctx.key_prefix("tput", path.label, size)
    res = ctx.results.throughput
    res += store.measure_single(path.writer, path.reader, path.label, size, plan, f"{prefix}/s", ctx.pool)
    res += store.measure_batches(path.writer, path.reader, path.label, size, plan, f"{prefix}/b", ctx.pool)


@section("throughput", needs_store=True)
def run_throughput(ctx: Context) -> None:
    for path in ctx.paths():
        for size in ctx.options.sizes:
            _attempt(ctx, f"throughput {path.label} {fmt_size(size)}", _throughput, ctx, path, size)


def _latency(ctx: Context, path: KVPath) -> None:
    cpu = ctx.server_cpu()
    lat, cpus = latency.measure_latency(
        path.writer,
        path.reader,
        path.label,
        ctx.options.latency,
        ctx.key_prefix("lat", path.label),
        ctx.pool,
        cpu,
        cpu.what if cpu else "",
    )
    ctx.results.latency += lat
    ctx.results.server_cpu += cpus


@section("latency", needs_store=True)
def run_latency(ctx: Context) -> None:
    for path in ctx.paths():
        _attempt(ctx, f"latency and server CPU {path.label} {fmt_size(ctx.options.latency.size)}", _latency, ctx, path)


def _prefix(ctx: Context, path: KVPath) -> None:
    rate = latency.measure_prefix(
        path.reader, PREFIX_BATCH, ctx.options.prefix_calls, ctx.key_prefix("prefix"), ctx.options.plan.repeats
    )
    ctx.results.prefix.append(rate)


@section("prefix", needs_store=True)
def run_prefix(ctx: Context) -> None:
    path = next(ctx.paths())  # metadata only: any path will do
    _attempt(ctx, f"match_prefix on {PREFIX_BATCH}-key batches", _prefix, ctx, path)


@section("engine", needs_store=True)
def run_engine(ctx: Context) -> None:
    from kvstore.bench import engine

    assert ctx.meta_address is not None
    for what, measure in engine.MEASURES:
        progress(f"engine: {what}")
        try:
            ctx.results.engine.append(measure(ctx.meta_address, ctx.options.engine_repeats, ctx.options.quick))
        except (KVStoreError, ImportError) as exc:
            ctx.results.skipped.append(Skipped(f"engine: {what}", f"{type(exc).__name__}: {exc}"))
            progress(f"engine: {what} skipped: {exc}")


def peer_spec(ctx: Context) -> PeerSpec:
    opts = ctx.options
    return PeerSpec(
        sizes=opts.sizes,
        plan=opts.plan,
        latency=opts.latency,
        prefix_batch=PREFIX_BATCH,
        prefix_calls=opts.prefix_calls,
        segment_size=opts.dram,
        key_prefix=ctx.key_prefix("peer"),
        pool_bytes=len(ctx.pool.array),
    )


@section("peers", needs_store=False)
def run_peers(ctx: Context) -> None:
    """Each --compare peer (registered by the peer plug-in, kvstore.bench.plugin), measured like
    kvstore after kvstore's servers are stopped."""
    spec = peer_spec(ctx)
    for name in ctx.options.compare:
        module = peer(name)
        progress(f"peer {name} ({PEERS[name]})")
        outcome = module.measure(spec, progress)
        ctx.results.extend(outcome.results)
        setup = module.describe(spec) + "".join(f"; {note}" for note in outcome.notes)
        ctx.results.baselines.append(Baseline(name, module.PATH, setup, outcome.unavailable, outcome.seconds))
        if outcome.unavailable:
            ctx.results.skipped.append(Skipped(name, f"unavailable: {outcome.unavailable}"))
            progress(f"{name}: unavailable: {outcome.unavailable}")


@section("tiers", needs_store=False)
def run_tiers(ctx: Context) -> None:
    """The SSD tier against the raw disk, with a store of its own (an SSD tier, demoting all)."""
    from kvstore.bench import tiers

    block = 16 << 20 if ctx.options.tiers_size >= 64 << 20 else 1 << 20
    transports = tuple(t for t in ctx.transports if t in ("shm", "tcp"))
    ctx.results.tiers.append(
        tiers.measure_tiers(ctx.options.tiers_dir, ctx.options.tiers_size, block, transports, progress)
    )


@section("metamem", needs_store=False)
def run_metamem(ctx: Context) -> None:
    progress(f"metadata memory at {ctx.options.meta_blocks} blocks")
    ctx.results.meta_memory.append(metamem.measure_in_subprocess(ctx.options.meta_blocks))
