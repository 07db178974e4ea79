"""A small HTTP server for a process's admin face: metrics, the dashboard, the indexer API.
Routes are registered by path; a handler takes the query and body and returns the response.
Standard library only (http.server), one thread per request; meant for operators and
scrapers, not for the data path."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)
MAX_BODY = 4 << 20


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Response:
        return cls(status, "application/json", json.dumps(value).encode())

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain; charset=utf-8") -> Response:
        return cls(status, content_type, text.encode())


Handler = Callable[[dict[str, list[str]], bytes], Response]


class AdminServer:
    """Routes (method, path) -> handler. Thread safe to add routes before or after start()."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._routes: dict[tuple[str, str], Handler] = {}
        routes = self._routes

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                handler = routes.get((method, url.path))
                if handler is None:
                    self._reply(Response.json({"error": f"no {method} {url.path}"}, 404))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > MAX_BODY:
                    self._reply(Response.json({"error": f"body over {MAX_BODY} bytes"}, 413))
                    return
                body = self.rfile.read(length) if length else b""
                try:
                    response = handler(parse_qs(url.query), body)
                except ValueError as exc:  # a handler's word for bad input
                    response = Response.json({"error": str(exc)}, 400)
                except Exception as exc:
                    log.exception("admin %s %s failed", method, url.path)
                    response = Response.json({"error": f"internal error: {exc}"}, 500)
                self._reply(response)

            def _reply(self, response: Response) -> None:
                self.send_response(response.status)
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(response.body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("admin: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.host = host
        self._thread = threading.Thread(target=self._server.serve_forever, name="admin-http", daemon=True)
        self.route("GET", "/health", lambda query, body: Response.json({"ok": True}))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes[(method, path)] = handler

    def start(self) -> AdminServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never began otherwise
            self._server.shutdown()
        self._server.server_close()
