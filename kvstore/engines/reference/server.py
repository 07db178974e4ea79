"""A reference engine instance behind an OpenAI-style HTTP API (`kvstore engine`).

    POST /v1/completions   {"prompt": str | [ids], "max_tokens", "stream", "kv_transfer_params"}
    GET  /kvstore/info     block size, key scheme and KV size: what a router needs
    GET  /load             queue depth and queued prompt tokens
    GET  /metrics          Prometheus text (per-request histograms, fallbacks; the store client's
                           transfers and links)
    POST /admin/faults     {"load_failure_rate": 0.5, "seed": 1}: fail KV loads on purpose

Responses carry three extensions: `kv_transfer_params` (a prefill instance's word on what it
stored), `kvstore` (the request's metrics, so a router can keep link and compute time apart) and
`kvstore_links` (the store client's link monitor: bandwidth and latency per daemon).
The engine's loop runs on its own thread, batching every request in flight (continuous batching);
the event loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvstore.engines.metrics import MetricsSink
from kvstore.engines.reference.engine import Generation, GenerationRequest, InvalidRequest, ReferenceEngine
from kvstore.engines.serving import SSE_DONE, sse
from kvstore.engines.tokenizer import ByteTokenizer

# What the engine's thread hands a request's queue: ("token", int)..., then ("done", Generation)
# or ("error", str).
_Event = tuple[str, Any]


class EngineWorker:
    """Runs the engine's loop on its own thread; requests join the running batch as they come."""

    def __init__(self, engine: ReferenceEngine, sink: MetricsSink) -> None:
        self.engine = engine
        self.sink = sink
        self._stop = threading.Event()
        self._thread = threading.Thread(target=engine.run, args=(self._stop,), name="engine", daemon=True)
        self._thread.start()

    def load(self) -> dict[str, int]:
        lo = self.engine.load()
        return {"queue_depth": lo.waiting, "queued_tokens": lo.queued_tokens, "running": lo.running}

    def submit(self, req: GenerationRequest) -> asyncio.Queue[_Event]:
        """Queue `req`; the returned queue gets ("token", id)..., then ("done", Generation) or
        ("error", message)."""
        events: asyncio.Queue[_Event] = asyncio.Queue()
        self.engine.submit(req, _EventSink(asyncio.get_running_loop(), events, self.sink))
        return events

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class _EventSink:
    """A request's results, handed from the engine's thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue[_Event], metrics: MetricsSink) -> None:
        self._loop = loop
        self._events = events
        self._metrics = metrics

    def _put(self, event: _Event) -> None:
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    def token(self, token: int) -> None:
        self._put(("token", token))

    def done(self, generation: Generation) -> None:
        self._metrics.observe(generation.metrics)
        self._put(("done", generation))

    def failed(self, error: Exception) -> None:
        self._put(("error", f"{type(error).__name__}: {error}"))


def _completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:24]}"


def build_app(engine: ReferenceEngine, sink: MetricsSink) -> Starlette:
    tokenizer = ByteTokenizer()
    worker: EngineWorker | None = None
    model_name = engine.model.config.name

    def running() -> EngineWorker:
        if worker is None:  # requests are served only once the lifespan has started it
            raise RuntimeError("the engine's worker is not running")
        return worker

    def chunk(rid: str, created: int, text: str, ids: list[int], finish: str | None, **extra: Any) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model_name,
            "choices": [{"index": 0, "text": text, "token_ids": ids, "finish_reason": finish}],
            **extra,
        }

    def trailer(gen: Generation) -> dict[str, Any]:
        usage = {
            "prompt_tokens": gen.metrics.prompt_tokens,
            "completion_tokens": len(gen.tokens),
            "total_tokens": gen.metrics.prompt_tokens + len(gen.tokens),
        }
        return {
            "usage": usage,
            "kv_transfer_params": gen.kv_transfer_params,
            "kvstore": asdict(gen.metrics),
            "kvstore_links": [link.to_dict() for link in engine.links()],
        }

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
            prompt = tokenizer.prompt_ids(body.get("prompt", ""))
            params = body.get("kv_transfer_params") or {}
            req = GenerationRequest(
                request.headers.get("x-request-id") or _completion_id(),
                prompt,
                int(body.get("max_tokens", 16)),
                int(params.get("expected_cached_tokens", 0)),
            )
            engine.validate(req)
        except (ValueError, TypeError, InvalidRequest) as exc:
            return JSONResponse({"error": {"message": str(exc), "type": "invalid_request_error"}}, 400)
        events = running().submit(req)
        created = int(time.time())
        if body.get("stream"):

            async def stream() -> AsyncIterator[bytes]:
                while True:
                    kind, value = await events.get()
                    if kind == "token":
                        yield sse(chunk(req.request_id, created, tokenizer.decode([value]), [value], None))
                    elif kind == "done":
                        yield sse(chunk(req.request_id, created, "", [], "length", **trailer(value)))
                        break
                    else:
                        yield sse({"error": {"message": value, "type": "engine_error"}})
                        break
                yield SSE_DONE

            return StreamingResponse(stream(), media_type="text/event-stream")
        while True:
            kind, value = await events.get()
            if kind == "done":
                return JSONResponse(
                    chunk(
                        req.request_id,
                        created,
                        tokenizer.decode(value.tokens),
                        value.tokens,
                        "length",
                        **trailer(value),
                    )
                )
            if kind == "error":
                return JSONResponse({"error": {"message": value, "type": "engine_error"}}, 500)

    async def info(_: Request) -> Response:
        return JSONResponse(engine.info())

    async def load(_: Request) -> Response:
        return JSONResponse(running().load())

    store_metrics = getattr(engine.connector.codec.client, "metrics", None) if engine.connector else None

    async def metrics(_: Request) -> Response:
        text = sink.exposition()
        if store_metrics is not None:  # the store client's transfers and links, mounted here
            text += generate_latest(store_metrics.registry)
        return Response(text, media_type="text/plain; version=0.0.4")

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model_name, "object": "model"}]})

    async def faults(request: Request) -> Response:
        if engine.connector is None:
            return JSONResponse({"error": {"message": "this instance has no store"}}, 400)
        body = await request.json()
        try:
            engine.connector.faults.configure(float(body.get("load_failure_rate", 0.0)), int(body.get("seed", 0)))
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, 400)
        return JSONResponse({"load_failure_rate": engine.connector.faults.load_failure_rate})

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        nonlocal worker
        worker = EngineWorker(engine, sink)
        try:
            yield
        finally:
            await asyncio.to_thread(worker.stop)
            engine.close()

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/kvstore/info", info),
            Route("/load", load),
            Route("/metrics", metrics),
            Route("/health", health),
            Route("/admin/faults", faults, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
