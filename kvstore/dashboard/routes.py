"""The observability routes of the metadata service's admin face.

GET  /metrics            Prometheus text (when the service counts metrics)
GET  /dashboard          the live page
GET  /dashboard/data     its JSON snapshot (kvstore top reads it too); 503 on a standby
POST /dashboard/routers  {"url": "http://router:8000"}: show that router's TTFT, TPOT, fallbacks
                         (the operator's token: the service fetches that URL every 2 s)
GET  /sd/targets         Prometheus HTTP service discovery: this service and every daemon's /metrics
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from kvstore.admin.http import AdminServer, Response
from kvstore.clock import Clock, SystemClock
from kvstore.dashboard.data import snapshot
from kvstore.metrics.history import History
from kvstore.observe import METRICS_ENDPOINT
from kvstore.results import StoreStats

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def mount(
    admin: AdminServer,
    stats: Callable[[], StoreStats | None],
    history: History,
    registry: Any | None,
    lookups: Callable[[], dict[tuple[str, str], float]],
    clock: Clock | None = None,
) -> None:
    """Add the routes to `admin`. `registry`: the service's CollectorRegistry, or None (metrics off:
    /metrics answers 404 and the page shows no hit rates). `stats` is None on a standby."""
    clock = clock or SystemClock()
    page = resources.files("kvstore.dashboard").joinpath("page.html").read_bytes()
    if registry is not None:
        from prometheus_client import generate_latest

        admin.route("GET", "/metrics", lambda q, b: Response(200, PROMETHEUS_TEXT, generate_latest(registry)))
    admin.route("GET", "/dashboard", lambda q, b: Response(200, "text/html; charset=utf-8", page))

    def data(query: dict[str, list[str]], body: bytes) -> Response:
        now = stats()
        if now is None:
            return Response.json({"error": "this metadata service is a standby: see its leader's dashboard"}, 503)
        return Response.json(snapshot(now, lookups(), history, clock.now()))

    admin.route("GET", "/dashboard/data", data)

    def register(query: dict[str, list[str]], body: bytes) -> Response:
        try:
            url = json.loads(body or b"{}").get("url", "")
        except (AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f'send {{"url": "http://HOST:PORT"}}: {exc}') from None
        history.register_router(str(url))
        return Response.json({"routers": list(history.routers)})

    admin.route("POST", "/dashboard/routers", register)

    def targets(query: dict[str, list[str]], body: bytes) -> Response:
        found = [{"targets": [admin.address], "labels": {"job": "kvstore-meta"}}]
        now = stats()
        for d in now.daemons if now is not None else ():
            urls = {e.address for s in d.segments for e in s.endpoints if e.transport == METRICS_ENDPOINT}
            for url in sorted(urls):
                found.append(
                    {"targets": [urlsplit(url).netloc], "labels": {"job": "kvstore-daemon", "daemon": d.daemon_id}}
                )
        return Response.json(found)

    admin.route("GET", "/sd/targets", targets)
