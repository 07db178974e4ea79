"""A small HTTP server for a process's admin face: metrics, the dashboard, the indexer API.
Routes are registered by path; a handler takes the query and body and returns the response.
Standard library only (http.server); meant for operators and scrapers, not for the data path,
and bound to an operator's host of its own (loopback by default), never the tenants' `--host`.

Guards (docs/security.md):
- A guarded route (by default every method but GET; a POST that only reads, such as the
  indexer's /query, is registered open) answers only a request carrying the operator's token
  (`Authorization: Bearer TOKEN`): 401 without a known token, 403 for a known caller who is not
  the operator. A server given no way to check tokens refuses every guarded route.
- One connection carries one request (HTTP/1.0), and each has `request_timeout_s` in all, from
  its accept to its last byte written: a client that sends nothing, or trickles, or reads
  nothing, is disconnected then, whatever its pace (a watchdog shuts the socket).
- At most `max_connections` handler threads at once: a connection past the cap is answered 503
  from the accepting thread, without a thread of its own, and closed.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from kvstore.errors import KVStoreError, Unauthenticated, Unavailable

log = logging.getLogger(__name__)
MAX_BODY = 4 << 20
WRITES = frozenset({"POST", "PUT", "DELETE", "PATCH"})


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


class AdminLimits(NamedTuple):
    request_timeout_s: float = 10.0  # a connection's whole life: request in, response out
    max_connections: int = 32  # handler threads at once; more connections are answered 503


Handler = Callable[[dict[str, list[str]], bytes], Response]
# Returns if a bearer token is the operator's; raises Unauthenticated (no token, or one not known)
# or another KVStoreError, such as PermissionDenied (a known caller who is not the operator).
OperatorCheck = Callable[[str], None]
_BUSY = b'{"error": "the admin face is busy: every handler thread is taken; retry"}'
_BUSY_REPLY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


class _Deadlines:
    """One watchdog thread that shuts each watched socket down once its deadline passes, which
    ends whatever read or write its handler thread is blocked in."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, socket.socket]] = []
        self._live: set[int] = set()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="admin-deadlines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self, sock: socket.socket, seconds: float) -> int:
        with self._cond:
            ticket = next(self._seq)
            heapq.heappush(self._heap, (time.monotonic() + seconds, ticket, sock))
            self._live.add(ticket)
            self._cond.notify()
        return ticket

    def forget(self, ticket: int) -> None:
        with self._cond:
            self._live.discard(ticket)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)  # finished in time
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, ticket, sock = self._heap[0]
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                self._live.discard(ticket)
                with contextlib.suppress(OSError):  # already closed
                    sock.shutdown(socket.SHUT_RDWR)
                log.debug("admin: closed a connection still open after its request timeout")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: AdminLimits) -> None:
        super().__init__(address, handler)
        self.limits = limits
        self.deadlines = _Deadlines()
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._tickets: dict[int, int] = {}  # id(socket) -> its watchdog ticket

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        self._tickets[id(request)] = self.deadlines.watch(request, self.limits.request_timeout_s)
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started (the caller closes the socket): give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # ends with shutdown_request
        finally:
            self._slots.release()

    def shutdown_request(self, request: Any) -> None:
        # Forgotten before it is closed: the watchdog never shuts a descriptor down once reused.
        self.deadlines.forget(self._tickets.pop(id(request), -1))
        super().shutdown_request(request)

    def _refuse(self, sock: socket.socket) -> None:
        """503 without blocking the accepting thread. What the client sent is read first where it
        has arrived: closing over unread bytes would reset the connection instead."""
        try:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.recv(65536)
            sock.send(_BUSY_REPLY)
        except OSError:
            pass
        log.debug("admin: refused a connection: %d handler threads busy", self.limits.max_connections)
        self.shutdown_request(sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client gone mid-request (or cut off at its deadline) is no traceback on stderr.
        log.debug("admin: request from %s ended early", client_address, exc_info=True)


class AdminServer:
    """Routes (method, path) -> handler. Thread safe to add routes before or after start().
    `operator`: checks the token of a guarded route's request (None: they are all refused)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        operator: OperatorCheck | None = None,
        limits: AdminLimits | None = None,
    ) -> None:
        self._routes: dict[tuple[str, str], tuple[Handler, bool]] = {}
        routes = self._routes

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                route = routes.get((method, url.path))
                if route is None:
                    self._reply(Response.json({"error": f"no {method} {url.path}"}, 404))
                    return
                handler, guarded = route
                if guarded and (refusal := _refusal(operator, self.headers.get("Authorization", ""), method, url.path)):
                    self._reply(refusal)
                    return
                length = _length(self.headers.get("Content-Length"))
                if length is None:
                    self._reply(Response.json({"error": "Content-Length is not a count of bytes"}, 400))
                    return
                if length > MAX_BODY:
                    self._reply(Response.json({"error": f"body over {MAX_BODY} bytes"}, 413))
                    return
                body = self.rfile.read(length) if length else b""
                if len(body) < length:  # the client went, or was cut off at its deadline
                    return
                try:
                    response = handler(parse_qs(url.query), body)
                except ValueError as exc:  # a handler's word for bad input
                    response = Response.json({"error": str(exc)}, 400)
                except Unavailable as exc:  # e.g. a feature whose extra is not installed: says which
                    response = Response.json({"error": str(exc)}, 503)
                except Exception as exc:
                    log.exception("admin %s %s failed", method, url.path)
                    response = Response.json({"error": f"internal error: {exc}"}, 500)
                self._reply(response)

            def _reply(self, response: Response) -> None:
                self.send_response(response.status)
                if response.status == 401:
                    self.send_header("WWW-Authenticate", 'Bearer realm="kvstore admin"')
                self.send_header("Content-Type", response.content_type)
                self.send_header("Content-Length", str(len(response.body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(response.body)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("admin: " + format, *args)

        self._server = _Server((host, port), _Handler, limits or AdminLimits())
        self.port = self._server.server_address[1]
        self.host = host
        self._thread = threading.Thread(target=self._server.serve_forever, name="admin-http", daemon=True)
        self.route("GET", "/health", lambda query, body: Response.json({"ok": True}))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def route(self, method: str, path: str, handler: Handler, guarded: bool | None = None) -> None:
        """Serve `method path` with `handler`. `guarded` (default: for writes, POST, PUT, DELETE)
        lets only the operator's token through; pass False for a POST that only reads."""
        self._routes[(method, path)] = (handler, method in WRITES if guarded is None else guarded)

    def start(self) -> AdminServer:
        self._server.deadlines.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never began otherwise
            self._server.shutdown()
        self._server.server_close()
        self._server.deadlines.stop()


def _length(header: str | None) -> int | None:
    """A request's Content-Length (0 when absent), or None for one that is not a count."""
    text = (header or "0").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def _refusal(operator: OperatorCheck | None, authorization: str, method: str, path: str) -> Response | None:
    """None if the request carries the operator's token; else the 401 or 403 to answer."""
    what = f"{method} {path}"
    if operator is None:
        return Response.json({"error": f"{what} is an operator's call, and this port takes none"}, 403)
    scheme, _, token = authorization.partition(" ")
    token = token.strip() if scheme.lower() == "bearer" else ""
    try:
        operator(token)
    except Unauthenticated:
        sent = ": the token sent is not known here" if token else ""
        return Response.json(
            {
                "error": f"{what} needs the operator's token{sent}: send `Authorization: Bearer TOKEN` with the "
                "admin token the service took at start ($KVSTORE_TOKEN, or the token file it names)"
            },
            401,
        )
    except KVStoreError as exc:
        return Response.json({"error": f"{what} needs the operator's token: {exc}"}, 403)
    return None
