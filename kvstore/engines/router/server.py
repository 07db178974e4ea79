"""The router's HTTP endpoints.

POST /v1/completions   OpenAI completions (stream or not), routed per request
GET  /metrics          Prometheus text: per-route TTFT/TPOT/queue/compute/transfer, fallbacks
GET  /router/state     the policy, measured bandwidth and prefill rate, per-instance load
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HttpRoute

from kvstore.engines.router.proxy import Router
from kvstore.engines.serving import SSE_DONE, sse


def build_app(make_router: Callable[[httpx.AsyncClient], Awaitable[Router]], timeout_s: float) -> Starlette:
    """`make_router(http)` is awaited at startup (it discovers the instances)."""
    started: Router | None = None

    def live() -> Router:
        if started is None:  # requests are served only once the lifespan has made it
            raise RuntimeError("the router has not started")
        return started

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        nonlocal started
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0), limits=limits) as http:
            started = await make_router(http)
            yield

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
            stream = live().complete(body)
            first = await anext(stream)
        except (ValueError, TypeError) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)
        except Exception as exc:  # noqa: BLE001 - any upstream failure is the client's 502
            return JSONResponse(
                {"error": {"message": f"no instance could serve the request: {exc}", "type": "upstream_error"}}, 502
            )
        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                yield sse(first)
                try:
                    async for event in stream:
                        yield sse(event)
                except Exception as exc:  # noqa: BLE001 - reported in the stream, which has begun
                    yield sse({"error": {"message": str(exc), "type": "upstream_error"}})
                yield SSE_DONE

            return StreamingResponse(events(), media_type="text/event-stream")
        ids: list[int] = []
        text: list[str] = []
        last = first
        try:
            async for event in _chain(first, stream):
                ids += event["choices"][0]["token_ids"]
                text.append(event["choices"][0]["text"])
                last = event
        except Exception as exc:  # noqa: BLE001 - any upstream failure is the client's 502
            return JSONResponse({"error": {"message": str(exc), "type": "upstream_error"}}, 502)
        last["choices"][0].update(text="".join(text), token_ids=ids)
        return JSONResponse(last)

    async def metrics(_: Request) -> Response:
        return Response(live().sink.exposition(), media_type="text/plain; version=0.0.4")

    async def state(_: Request) -> Response:
        router = live()
        return JSONResponse(
            {
                "policy": router.policy.name,
                "bandwidth_bytes_per_s": router.telemetry.bandwidth(),
                "prefill_tokens_per_s": router.telemetry.prefill_tps(),
                "fallbacks": router.sink.fallbacks(),
                "links": router.telemetry.links(),
                "summary": router.sink.summary(),
                "loads": {u: {"requests": lo.requests, "tokens": lo.tokens} for u, lo in router.loads().items()},
                "time": time.time(),
                **({"prefix_index": index.stats()} if (index := getattr(router.backend, "index", None)) else {}),
            }
        )

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            HttpRoute("/v1/completions", completions, methods=["POST"]),
            HttpRoute("/metrics", metrics),
            HttpRoute("/router/state", state),
            HttpRoute("/health", health),
        ],
        lifespan=lifespan,
    )


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item
