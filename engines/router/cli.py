"""`kvstore route`: the PD router, an OpenAI-compatible front end over engine instances.

Prints `kvstore ready: router=http://HOST:PORT policy=NAME` once it accepts requests.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

from kvstore.engines.router.policy import CostModel

log = logging.getLogger("kvstore.engines.router")


def _urls(values: list[str] | None) -> tuple[str, ...]:
    return tuple(u.strip().rstrip("/") for v in values or [] for u in v.split(",") if u.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = CostModel()
    p.add_argument("--prefill", action="append", help="prefill instance URL(s); repeat or comma-separate")
    p.add_argument("--decode", action="append", help="decode instance URL(s)")
    p.add_argument("--colocated", action="append", help="colocated instance URL(s)")
    p.add_argument("--meta", default=None, help="kvstore metadata service, for prefix lookups")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port")
    p.add_argument("--policy", default="cost", choices=["cost", "dynamo", "colocated", "pd"],
                   help="cost: the cost model; dynamo: length+queue thresholds; colocated/pd: fixed")
    p.add_argument("--cached-fraction", type=float, default=d.cached_fraction,
                   help="prefix share cached at or above which a request goes straight to decode")
    p.add_argument("--max-decode-tail", type=int, default=d.max_decode_tail_tokens,
                   help="...or uncached tokens at or below which it does")
    p.add_argument("--min-disagg-tokens", type=int, default=d.min_disagg_tokens,
                   help="uncached prompts shorter than this stay colocated")
    p.add_argument("--max-prefill-queue", type=int, default=d.max_prefill_queue)
    p.add_argument("--interference-weight", type=float, default=d.interference_weight)
    p.add_argument("--bandwidth", type=float, default=d.default_bandwidth,
                   help="link bytes/s assumed until transfers are measured")
    p.add_argument("--prefill-tps", type=float, default=d.default_prefill_tps,
                   help="prefill tokens/s assumed until prefills are measured")
    p.add_argument("--window", type=float, default=d.window_s, help="seconds of measurements kept")
    p.add_argument("--max-local-prefill", type=int, default=d.max_local_prefill_length,
                   help="the dynamo policy's length threshold")
    p.add_argument("--timeout", type=float, default=300.0, help="per upstream request, seconds")
    p.add_argument("--metrics-jsonl", default=None, help="append one JSON line per request here")


def run(args: argparse.Namespace) -> int:
    from kvstore.engines.metrics import MetricsSink
    from kvstore.engines.router.policy import Pools, make_policy
    from kvstore.engines.router.telemetry import Telemetry
    from kvstore.engines.router.proxy import Router, discover
    from kvstore.engines.router.server import build_app
    from kvstore.engines.serving import run_http

    log.setLevel(logging.INFO)                                # each route decision and its reason
    logging.getLogger("httpx").setLevel(logging.WARNING)      # one line per upstream call is noise
    pools = Pools(_urls(args.prefill), _urls(args.decode), _urls(args.colocated))
    store = None
    if args.meta:
        from kvstore.client import KVClient
        from kvstore.config import ClientConfig, load_config

        store = KVClient(args.meta, load_config(ClientConfig))      # KVSTORE_CLIENT_* env applies
    jsonl = open(args.metrics_jsonl, "a") if args.metrics_jsonl else None
    sink = MetricsSink("router", jsonl)

    async def make_router(http):
        naming = await discover(http, pools)
        live_pools = replace(pools, storeless=naming.storeless)
        model = CostModel(kv_bytes_per_token=naming.kv_bytes_per_token, cached_fraction=args.cached_fraction,
                          max_decode_tail_tokens=args.max_decode_tail, min_disagg_tokens=args.min_disagg_tokens,
                          max_prefill_queue=args.max_prefill_queue, interference_weight=args.interference_weight,
                          default_bandwidth=args.bandwidth, default_prefill_tps=args.prefill_tps,
                          window_s=args.window, max_local_prefill_length=args.max_local_prefill)
        telemetry = Telemetry(model)
        return Router(live_pools, make_policy(args.policy, model, telemetry), telemetry, naming, http, sink, store)

    def ready(url: str) -> None:
        print(f"kvstore ready: router={url} policy={args.policy}", flush=True)

    try:
        run_http(build_app(make_router, args.timeout), args.host, args.port, ready)
    finally:
        if store is not None:
            store.close()
        if jsonl is not None:
            jsonl.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore route", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
