"""`kvstore route`: the PD router, an OpenAI-compatible front end over engine instances.

`--backend reference` (the default) fronts kvstore's reference engine; `--backend vllm` fronts vLLM
OpenAI servers running kvstore's connector (see kvstore/engines/router/vllm_backend.py).
Prints `kvstore ready: router=http://HOST:PORT policy=NAME backend=NAME` once it accepts requests.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvstore.engines.router.policy import CostModel
from kvstore.logs import say_ready

if TYPE_CHECKING:
    import httpx

    from kvstore.engines.router.backend import Backend
    from kvstore.engines.router.policy import Pools

log = logging.getLogger("kvstore.engines.router")


def _urls(values: list[str] | None) -> tuple[str, ...]:
    return tuple(u.strip().rstrip("/") for v in values or [] for u in v.split(",") if u.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = CostModel()
    p.add_argument("--prefill", action="append", help="prefill instance URL(s); repeat or comma-separate")
    p.add_argument("--decode", action="append", help="decode instance URL(s)")
    p.add_argument("--colocated", action="append", help="colocated instance URL(s)")
    p.add_argument(
        "--backend",
        default="reference",
        choices=["reference", "vllm"],
        help="the engine behind the router: kvstore's reference engine, or vLLM OpenAI servers "
        "with kvstore's connector",
    )
    p.add_argument("--meta", default=None, help="kvstore metadata service, for prefix lookups (reference backend)")
    p.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=d.kv_bytes_per_token,
        help="vllm backend: KV bytes per prompt token, for the link estimate (2 x layers x kv heads "
        "x head size x dtype bytes); the reference backend reads it from its instances",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port")
    p.add_argument(
        "--policy",
        default="cost",
        choices=["cost", "dynamo", "colocated", "pd"],
        help="cost: the cost model; dynamo: length+queue thresholds; colocated/pd: fixed",
    )
    p.add_argument(
        "--cached-fraction",
        type=float,
        default=d.cached_fraction,
        help="prefix share cached at or above which a request goes straight to decode",
    )
    p.add_argument(
        "--max-decode-tail",
        type=int,
        default=d.max_decode_tail_tokens,
        help="...or uncached tokens at or below which it does",
    )
    p.add_argument(
        "--min-disagg-tokens",
        type=int,
        default=d.min_disagg_tokens,
        help="uncached prompts shorter than this stay colocated",
    )
    p.add_argument("--max-prefill-queue", type=int, default=d.max_prefill_queue)
    p.add_argument("--interference-weight", type=float, default=d.interference_weight)
    p.add_argument(
        "--bandwidth", type=float, default=d.default_bandwidth, help="link bytes/s assumed until transfers are measured"
    )
    p.add_argument(
        "--prefill-tps",
        type=float,
        default=d.default_prefill_tps,
        help="prefill tokens/s assumed until prefills are measured",
    )
    p.add_argument("--window", type=float, default=d.window_s, help="seconds of measurements kept")
    p.add_argument(
        "--max-local-prefill", type=int, default=d.max_local_prefill_length, help="the dynamo policy's length threshold"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="per upstream request, seconds")
    p.add_argument(
        "--wait-for-instances",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="retry discovery this long while instances start (a vLLM server takes a minute); 0: fail at once",
    )
    p.add_argument("--metrics-jsonl", default=None, help="append one JSON line per request here")
    p.add_argument(
        "--kv-events",
        action="append",
        default=None,
        metavar="URL=ENDPOINT[,REPLAY]",
        help="vllm backend: an instance's KV event endpoint (its --kv-events-config), e.g. "
        "http://127.0.0.1:8100=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558; repeat per instance. "
        "The router then routes each prompt to the instance whose own cache holds most of it "
        "(kvstore/engines/router/affinity.py)",
    )
    p.add_argument(
        "--store-events",
        default=None,
        metavar="ENDPOINT[,REPLAY]",
        help="vllm backend: kvstore's KV events (the metadata service's events_port), so the "
        "router knows what the store holds",
    )
    p.add_argument(
        "--kv-block-size",
        type=int,
        default=0,
        help="the instances' KV block size (vLLM's --block-size), needed with --kv-events or --store-events",
    )
    p.add_argument(
        "--dashboard",
        default=None,
        metavar="HOST:PORT",
        help="the metadata service's admin face: register there, so its dashboard shows this "
        "router's TTFT, TPOT and fallback rate",
    )


def run(args: argparse.Namespace) -> int:
    from kvstore.engines.metrics import MetricsSink
    from kvstore.engines.router.policy import Pools, make_policy
    from kvstore.engines.router.proxy import Router
    from kvstore.engines.router.server import build_app
    from kvstore.engines.router.telemetry import Telemetry
    from kvstore.engines.serving import run_http

    log.setLevel(logging.INFO)  # each route decision and its reason
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per upstream call is noise
    pools = Pools(_urls(args.prefill), _urls(args.decode), _urls(args.colocated))
    store = None
    if args.meta and args.backend == "reference":
        from kvstore.client import KVClient
        from kvstore.config import ClientConfig, load_config

        store = KVClient(args.meta, load_config(ClientConfig))  # KVSTORE_CLIENT_* env applies
    elif args.meta:
        log.info("--meta is not used with --backend %s: the router does not look prompts up", args.backend)
    index = _prefix_index(args)
    backend = _backend(args, store, index)
    jsonl = open(args.metrics_jsonl, "a") if args.metrics_jsonl else None  # noqa: SIM115 - open for the life of the server
    sink = MetricsSink("router", jsonl)

    if args.wait_for_instances > 0:
        # Before the HTTP server starts, so that Ctrl-C or SIGTERM stop a router still waiting.
        asyncio.run(_wait_for_instances(backend, pools, args.wait_for_instances))

    async def make_router(http: httpx.AsyncClient) -> Router:
        found = await backend.discover(http, pools)
        live_pools = replace(pools, storeless=found.storeless)
        model = CostModel(
            kv_bytes_per_token=found.kv_bytes_per_token,
            kv_replicas=found.kv_replicas,
            cached_fraction=args.cached_fraction,
            max_decode_tail_tokens=args.max_decode_tail,
            min_disagg_tokens=args.min_disagg_tokens,
            max_prefill_queue=args.max_prefill_queue,
            interference_weight=args.interference_weight,
            default_bandwidth=args.bandwidth,
            default_prefill_tps=args.prefill_tps,
            window_s=args.window,
            max_local_prefill_length=args.max_local_prefill,
        )
        telemetry = Telemetry(model)
        policy = make_policy(args.policy, model, telemetry)
        if index is not None:
            from kvstore.engines.router.affinity import PrefixAffinity

            # What loading a token from kvstore costs against computing it, in the cost model's terms.
            policy = PrefixAffinity(
                policy, lambda: model.kv_bytes_per_token * telemetry.prefill_tps() / telemetry.bandwidth()
            )
        return Router(live_pools, policy, telemetry, backend, http, sink)

    def ready(url: str) -> None:
        if args.dashboard:
            _register(args.dashboard, url)
        say_ready(f"router={url} policy={args.policy} backend={args.backend}")

    try:
        run_http(build_app(make_router, args.timeout), args.host, args.port, ready)
    finally:
        if store is not None:
            store.close()
        if index is not None:
            index.close()
        if jsonl is not None:
            jsonl.close()
    return 0


async def _wait_for_instances(backend: Backend, pools: Pools, wait_s: float) -> None:
    """Retry backend.discover while instances refuse connections or are not ready yet."""
    import httpx

    deadline = time.monotonic() + wait_s
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        while True:
            try:
                await backend.discover(http, pools)
                return
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                if time.monotonic() >= deadline:
                    raise
                log.info("waiting for the instances to start (%s)", exc)
                await asyncio.sleep(1.0)  # polling for readiness


def _register(admin: str, url: str) -> None:
    """Tell the service's dashboard where this router is (it polls /router/state). An operator's
    call: it carries the operator's token ($KVSTORE_TOKEN, else the token file)."""
    import json
    import urllib.request

    from kvstore.tokens import client_token

    base = admin if admin.startswith("http") else f"http://{admin}"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {client_token()}"}
    request = urllib.request.Request(
        f"{base}/dashboard/routers", data=json.dumps({"url": url}).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=5):
            pass
    except OSError as exc:  # the router serves without a dashboard
        log.warning("could not register with the dashboard at %s: %s", base, exc)


def _backend(args: argparse.Namespace, store: Any | None, index: Any | None = None) -> Backend:
    """The one place backends are chosen by name; each is imported only when chosen."""
    if args.backend == "vllm" and index is not None:
        from kvstore.engines.router.prefix_backend import PrefixVLLMBackend

        return PrefixVLLMBackend(args.kv_bytes_per_token, index)
    if args.backend == "vllm":
        from kvstore.engines.router.vllm_backend import VLLMBackend

        return VLLMBackend(args.kv_bytes_per_token)
    from kvstore.engines.router.reference_backend import ReferenceBackend

    return ReferenceBackend(store)


def _prefix_index(args: argparse.Namespace) -> Any | None:
    """The KV-event-fed prefix index of --kv-events / --store-events, or None without them."""
    if not (args.kv_events or args.store_events):
        return None
    if args.backend != "vllm":
        raise SystemExit(
            "--kv-events and --store-events are for --backend vllm (the reference backend asks kvstore directly)"
        )
    if args.kv_block_size <= 0:
        raise SystemExit("--kv-events and --store-events need --kv-block-size (the instances' vLLM --block-size)")
    from kvstore.engines.router.prefix_index import EventSource, PrefixIndex

    index = PrefixIndex(args.kv_block_size)
    try:
        for spec in args.kv_events or []:
            url, sep, source = spec.partition("=")
            if not sep:
                raise ValueError(f"--kv-events takes URL=ENDPOINT[,REPLAY], got {spec!r}")
            index.watch_instance(url.strip().rstrip("/"), EventSource.parse(source))
        if args.store_events:
            index.watch_store(EventSource.parse(args.store_events))
    except ValueError as exc:
        index.close()
        raise SystemExit(f"kvstore route: {exc}") from exc
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore route", description=__doc__)
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="json: one JSON object per line, with the request id of the request it is about",
    )
    parser.add_argument("--log-level", default="INFO")
    add_arguments(parser)
    args = parser.parse_args(argv)
    from kvstore.jsonlog import configure

    configure(args.log_level, args.log_format)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
