"""`kvstore engine`: start one reference engine instance (prefill, decode or colocated).

Prints `kvstore ready: engine=http://HOST:PORT role=ROLE` once it accepts requests.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from kvstore.engines.keys import Granularity
from kvstore.engines.reference.config import EngineConfig, Role
from kvstore.engines.reference.scheduler import SchedulerConfig
from kvstore.logs import say_ready

log = logging.getLogger("kvstore.engines")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", choices=[r.value for r in Role], default=Role.COLOCATED.value)
    p.add_argument(
        "--meta",
        default=None,
        help="kvstore metadata service; without it the instance neither loads nor saves KV (a plain colocated engine)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100, help="0 = any free port")
    p.add_argument("--block-size", type=int, default=EngineConfig.block_size)
    p.add_argument("--cache-blocks", type=int, default=EngineConfig.cache_blocks)
    p.add_argument(
        "--granularity",
        choices=[g.value for g in Granularity],
        default=Granularity.LAYER.value,
        help="store one object per block (all layers) or per (block, layer)",
    )
    d = SchedulerConfig()
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=d.max_num_seqs,
        help="requests loading or running at once (1: one request at a time, no batching)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=d.max_batch_tokens,
        help="tokens computed per step, decodes and prefill chunks together",
    )
    p.add_argument(
        "--no-chunked-prefill",
        action="store_true",
        help="compute each prompt whole, in a step of its own, instead of in chunks",
    )
    p.add_argument(
        "--no-save-output-kv",
        action="store_true",
        help="decode/colocated: do not save the blocks a request fills while generating",
    )
    p.add_argument(
        "--load-deadline",
        type=float,
        default=EngineConfig.load_deadline_s,
        help="seconds a KV load may take before the prompt is recomputed instead",
    )
    p.add_argument("--kv-transports", default=None, help="client transports in preference order, e.g. tcp")
    p.add_argument("--kv-timeout", type=float, default=None, help="client RPC / transfer timeout, seconds")
    p.add_argument("--tenant", default=EngineConfig.tenant)
    p.add_argument("--hash-seed", type=int, default=EngineConfig.hash_seed)
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-kv-heads", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument(
        "--inject-load-failures", type=float, default=0.0, help="fraction of KV loads to fail part-way, on purpose"
    )
    p.add_argument("--metrics-jsonl", default=None, help="append one JSON line per request here")


def run(args: argparse.Namespace) -> int:
    import torch

    from kvstore.engines.metrics import MetricsSink
    from kvstore.engines.reference.connector import FaultInjector
    from kvstore.engines.reference.engine import ReferenceEngine
    from kvstore.engines.reference.model import ModelConfig, ReferenceModel
    from kvstore.engines.reference.server import build_app
    from kvstore.engines.serving import run_http

    if args.threads:
        torch.set_num_threads(args.threads)
    model = ReferenceModel(
        ModelConfig(
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            num_kv_heads=args.num_kv_heads,
            intermediate_size=args.hidden_size * 8 // 3,
            seed=args.model_seed,
        )
    )
    config = EngineConfig(
        role=Role(args.role),
        block_size=args.block_size,
        cache_blocks=args.cache_blocks,
        granularity=Granularity(args.granularity),
        load_deadline_s=args.load_deadline,
        tenant=args.tenant,
        hash_seed=args.hash_seed,
        batching=SchedulerConfig(args.max_num_seqs, args.max_batch_tokens, not args.no_chunked_prefill),
        save_output_kv=not args.no_save_output_kv,
    )
    store = None
    if args.meta:
        from kvstore.client import KVClient
        from kvstore.config import ClientConfig, load_config

        overrides: dict[str, Any] = {}
        if args.kv_transports:
            overrides["transports"] = tuple(t.strip() for t in args.kv_transports.split(",") if t.strip())
        if args.kv_timeout:
            overrides["timeout_s"] = args.kv_timeout
        store = KVClient(args.meta, load_config(ClientConfig, None, **overrides))
    engine = ReferenceEngine(model, config, store, FaultInjector(args.inject_load_failures))
    jsonl = open(args.metrics_jsonl, "a") if args.metrics_jsonl else None  # noqa: SIM115 - open for the life of the server
    app = build_app(engine, MetricsSink("engine", jsonl))

    def ready(url: str) -> None:
        say_ready(f"engine={url} role={config.role.value} store={args.meta or 'none'} max_num_seqs={args.max_num_seqs}")

    try:
        run_http(app, args.host, args.port, ready)
    finally:
        if store is not None:
            store.close()
        if jsonl is not None:
            jsonl.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore engine", description=__doc__)
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="json: one JSON object per line, with the request id of the request it is about",
    )
    parser.add_argument("--log-level", default="WARNING")
    add_arguments(parser)
    args = parser.parse_args(argv)
    from kvstore.jsonlog import configure

    configure(args.log_level, args.log_format)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
