"""HTTP plumbing shared by engine instances, the router and the demo: run an ASGI app on a port
(0 = any) and announce it once it accepts connections; OpenAI-style server-sent events."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn

log = logging.getLogger("kvstore.engines")

SSE_DONE = b"data: [DONE]\n\n"
_SSE_BREAK = re.compile(r"\r\n|\r|\n")


class _AnnouncingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self._on_ready(f"http://{host}:{port}")


def run_http(app: Any, host: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Serve `app` until SIGINT/SIGTERM; `on_ready(url)` runs once the socket is listening
    (processes print their readiness line there, so parents never sleep)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=5
    )
    _AnnouncingServer(config, on_ready).run()


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def sse_lines(chunks: AsyncIterator[str]) -> AsyncIterator[str]:
    """The lines of an SSE stream (from httpx's `aiter_text`), split where SSE splits them: at
    \n, \r\n or \r. Not httpx's `aiter_lines`, which splits at every Unicode line break as
    str.splitlines does: a token whose text holds U+2028 or U+0085 (JSON leaves them unescaped)
    would cut its event in two."""
    rest = ""
    async for chunk in chunks:
        *lines, rest = _SSE_BREAK.split(rest + chunk)
        for line in lines:
            yield line
    if rest:
        yield rest


async def iter_sse(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an SSE stream (its lines from `sse_lines`), up to `[DONE]`."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)
