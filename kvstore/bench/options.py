"""The options of one bench run (BenchOptions), built from the `kvstore bench` flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvstore.bench.latency import LatencyPlan
from kvstore.bench.results import Skipped
from kvstore.bench.store import ThroughputPlan
from kvstore.config import parse_size
from kvstore.errors import KVStoreError

SECTION_ORDER = ("ceilings", "throughput", "latency", "prefix", "engine", "peers", "tiers", "metamem")
DEFAULT_SECTIONS = ("ceilings", "throughput", "latency", "prefix", "engine", "metamem")
DEFAULT_TRANSPORTS = ("shm", "tcp")
COMPARE_TRANSPORTS = ("mooncake", "nixl", "ucx")  # measured too with --compare, where installed


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
    compare: tuple[str, ...] = ()  # peer stores measured beside kvstore (checked by kvstore.bench.plugin.load)
    not_measured: tuple[Skipped, ...] = ()  # transports --compare would add but cannot, and why
    tiers_dir: str | None = None  # --tiers: where the SSD tier and raw disk are measured
    tiers_size: int = 512 << 20

    def __post_init__(self) -> None:
        unknown = set(self.sections) - set(SECTION_ORDER)
        if unknown:
            raise ValueError(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTION_ORDER)}")
        if not self.transports or not self.sizes or self.meta_blocks < 1:
            raise ValueError("need at least one transport, one size and one metadata block")

    @property
    def plan(self) -> ThroughputPlan:
        if self.quick:
            return ThroughputPlan(phase_bytes=16 << 20, max_single_ops=30, max_rounds=4, time_cap_s=0.5)
        return ThroughputPlan()

    @property
    def latency(self) -> LatencyPlan:
        return LatencyPlan(ops=100, warmup=10) if self.quick else LatencyPlan()

    @property
    def prefix_calls(self) -> int:
        return 5 if self.quick else 20

    @property
    def socket_round_bytes(self) -> int:
        return (64 if self.quick else 256) << 20

    @property
    def engine_repeats(self) -> int:
        return 3


def _csv(text: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in (text or "").split(",") if s.strip())


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """BenchOptions from the `kvstore bench` flags; ValueError or KVStoreError if one is bad."""
    from kvstore.transport import registry

    quick = bool(args.quick)
    default_sizes = "4KiB,1MiB" if quick else "4KiB,64KiB,1MiB,16MiB"
    compare = _csv(getattr(args, "compare", None))
    sections = _csv(args.sections) or DEFAULT_SECTIONS
    if compare and "peers" not in sections:
        sections += ("peers",)
    if getattr(args, "tiers", False) and "tiers" not in sections:
        sections += ("tiers",)
    not_measured: list[Skipped] = []
    if args.transports:
        transports = _csv(args.transports)
        for name in transports:
            registry.client_class(name)  # an unknown or uninstalled transport fails here, not mid-run
    else:
        transports = DEFAULT_TRANSPORTS
        if "mooncake" in compare:
            extra, not_measured = available_transports(COMPARE_TRANSPORTS)
            transports += extra
    return BenchOptions(
        tiers_dir=getattr(args, "tiers_dir", None),
        tiers_size=parse_size(getattr(args, "tiers_size", None) or "512MiB") // (4 if quick else 1),
        meta=args.meta,
        quick=quick,
        transports=transports,
        sizes=tuple(_size(s) for s in _csv(args.sizes or default_sizes)),
        meta_blocks=args.meta_blocks or (100_000 if quick else 1_000_000),
        json_path=args.json,
        dram=parse_size(args.dram or ("1GiB" if quick else "4GiB")),
        segment_size=parse_size(args.segment_size),
        sections=tuple(s for s in SECTION_ORDER if s in sections)
        + tuple(s for s in sections if s not in SECTION_ORDER),
        compare=compare,
        not_measured=tuple(not_measured),
    )


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
