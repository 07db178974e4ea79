"""The options of one trace replay (TraceOptions), built from `kvstore bench trace`'s flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from kvstore.bench.trace.sizing import KVSize, kv_bytes_of_model, parse_tokens

DEFAULT_CAPACITY = "1M,3M,10M"


@dataclass(frozen=True)
class TraceOptions:
    file: str
    kv: KVSize
    capacities: tuple[int, ...]  # tokens; empty with --meta (the store's own)
    meta: str | None
    speed: float
    limit: int
    json_path: str | None
    png_path: str | None

    def __post_init__(self) -> None:
        if self.meta is None and not self.capacities:
            raise ValueError("give at least one --capacity")
        if self.speed < 0 or self.limit < 0:
            raise ValueError("--speed and --limit must not be negative")


def options_from_args(args: argparse.Namespace) -> TraceOptions:
    """TraceOptions from the flags; ValueError (one line for the user) if one is bad."""
    if args.model is not None:
        per_token, source = kv_bytes_of_model(args.model)
    else:
        per_token, source = args.kv_bytes_per_token, "--kv-bytes-per-token"
    if per_token <= 0:
        raise ValueError("--kv-bytes-per-token must be positive")
    capacities: tuple[int, ...] = ()
    if args.meta is None:
        capacities = tuple(parse_tokens(c) for c in (args.capacity or DEFAULT_CAPACITY).split(",") if c.strip())
    elif args.capacity is not None:
        raise ValueError("--capacity sizes the stores the bench starts; with --meta the store's own DRAM is used")
    png = args.png
    if png is None and args.json:
        png = str(Path(args.json).with_suffix(".png"))
    return TraceOptions(
        file=args.file,
        kv=KVSize(per_token, args.scale, source),
        capacities=capacities,
        meta=args.meta,
        speed=args.speed,
        limit=args.limit,
        json_path=args.json,
        png_path=png,
    )
