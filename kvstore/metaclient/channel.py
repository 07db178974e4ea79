"""How a process reaches the metadata service: gRPC, plus the service's fast lane when it offers
one (kvstore/wire/frames.py: the same messages over a plain socket, ~10x cheaper per call).

A failed call becomes the kvstore error it stands for: the service sends the full ErrorDetail
(gRPC trailing metadata, or the fast lane's error frame), so a caller can tell NoSpace from
KeyBusy from Unavailable by type, whichever lane carried the call.

Every call carries the caller's bearer token (gRPC metadata; the fast lane's HELLO, once per
connection). With TLS files both lanes speak TLS, checking the service against `tls.ca`.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import grpc

from kvstore.errors import KVStoreError, PermissionDenied, Unavailable, from_rpc_error
from kvstore.tls import TlsFiles, client_context, grpc_channel_credentials
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc
from kvstore.version import __version__
from kvstore.wire import convert, frames

log = logging.getLogger(__name__)
_GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
_RETRY_LANE_AFTER_S = 2.0
_MAX_IDLE = 8


class MetaChannel:
    """Thread safe. `call(name, request)` runs one MetaService call and returns its response
    message, or raises the kvstore error for its failure."""

    def __init__(
        self, address: str, timeout_s: float, fast_lane: bool = True, token: str = "", tls: TlsFiles | None = None
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._token = token
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._tls = tls or TlsFiles()
        self._ssl: ssl.SSLContext | None = client_context(self._tls) if self._tls.dialling else None
        if self._tls.dialling:
            options: list[tuple[str, Any]] = list(_GRPC_OPTIONS)
            if self._tls.server_name:
                options.append(("grpc.ssl_target_name_override", self._tls.server_name))
            self._channel = grpc.secure_channel(address, grpc_channel_credentials(self._tls), options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=_GRPC_OPTIONS)
        self._stub = pb_grpc.MetaServiceStub(self._channel)
        self._want_lane = fast_lane
        self._lane_port: int | None = None  # None: ask ServiceInfo; 0: none offered (or refused)
        self._lane_down_until = 0.0
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def fast_lane_port(self) -> int:
        """The fast lane's port in use, 0 when calls go over gRPC."""
        return self._lane_port or 0

    def call(self, name: str, request: Any, timeout_s: float | None = None) -> Any:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        sock = self._lane_socket(timeout)
        if sock is not None:
            return self._begin_lane(sock, name, request, timeout)()
        try:  # a blocking gRPC call costs less than a future
            return getattr(self._stub, name)(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise _grpc_error(exc, f"{name} to {self.address}") from exc

    def begin(self, name: str, request: Any, timeout_s: float | None = None) -> Callable[[], Any]:
        """Send one call now and return what waits for its answer (the response message, or the
        call's kvstore error), so a caller can have calls to several services in flight at once."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        sock = self._lane_socket(timeout)
        if sock is not None:
            return self._begin_lane(sock, name, request, timeout)
        what = f"{name} to {self.address}"
        future = getattr(self._stub, name).future(request, timeout=timeout, metadata=self._metadata)

        def finish() -> Any:
            try:
                return future.result()
            except grpc.RpcError as exc:
                raise _grpc_error(exc, what) from exc

        return finish

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
        self._channel.close()

    # -- the fast lane ----------------------------------------------------------------------------

    def _lane_socket(self, timeout: float) -> socket.socket | None:
        """A connection to the fast lane, or None to use gRPC (no lane, or it is down)."""
        if not self._want_lane or time.monotonic() < self._lane_down_until:
            return None
        if self._lane_port is None:
            try:
                info = self._stub.ServiceInfo(pb.ServiceInfoRequest(), timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # an older service has no lane
                    self._lane_port = 0
                    return None
                raise _grpc_error(exc, f"ServiceInfo to {self.address}") from exc
            self._lane_port = info.fast_lane_port
        if not self._lane_port:
            return None
        with self._lock:
            while self._idle:
                sock = self._idle.pop()
                if _still_idle(sock):
                    return sock
                sock.close()
        return self._connect(self._lane_port, timeout)

    def _connect(self, port: int, timeout: float) -> socket.socket | None:
        host = self.address.rsplit(":", 1)[0].strip("[]")
        try:
            sock = socket.create_connection((host, port), timeout=timeout)  # this call's time, not more
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._tls.server_name or host)
            sock.sendall(frames.hello_frame(__version__, self._token))
            (_, status), body = frames.recv_frame(sock, frames.RESPONSE)
            sock.settimeout(self.timeout_s)  # pooled connections keep the default
        except (OSError, EOFError, frames.BadFrame) as exc:
            # The service may have restarted on another lane port: ask again after a pause.
            log.warning("fast lane %s:%d unreachable (%s); using gRPC for %.0f s", host, port, exc, _RETRY_LANE_AFTER_S)
            self._lane_port = None
            self._lane_down_until = time.monotonic() + _RETRY_LANE_AFTER_S
            return None
        if status != frames.OK:
            sock.close()
            detail = _detail_error(body, f"the fast lane of {self.address}")
            if isinstance(detail, PermissionDenied):
                raise detail  # gRPC would refuse the same token
            log.warning("fast lane of %s refused this client (%s); using gRPC", self.address, detail)
            self._lane_port = 0
            return None
        return sock

    def _begin_lane(self, sock: socket.socket, name: str, request: Any, timeout: float) -> Callable[[], Any]:
        method, header, payload = frames.encode_request(name, request)
        try:
            if timeout != self.timeout_s:  # pooled connections keep the default: no syscall per call
                sock.settimeout(timeout)
            frames.send_frame(sock, header, payload)
        except OSError as exc:
            raise self._lane_failed(sock, name, exc) from exc
        return lambda: self._finish_lane(sock, name, method.response, timeout)

    def _finish_lane(self, sock: socket.socket, name: str, response: Any, timeout: float) -> Any:
        try:
            (_, status), body = frames.recv_frame(sock, frames.RESPONSE)
            if timeout != self.timeout_s:
                sock.settimeout(self.timeout_s)
        except (OSError, EOFError, frames.BadFrame) as exc:
            raise self._lane_failed(sock, name, exc) from exc
        failure = _detail_error(body, f"{name} to {self.address}") if status != frames.OK else None
        # The service closes a connection whose token it refuses: never pool one (the next call
        # would find it reset, and report the service down instead of the refusal).
        with self._lock:
            keep = len(self._idle) < _MAX_IDLE and not isinstance(failure, PermissionDenied)
            if keep:
                self._idle.append(sock)
        if not keep:
            sock.close()
        if failure is not None:
            raise failure
        return response.FromString(body)

    def _lane_failed(self, sock: socket.socket, name: str, exc: BaseException) -> Unavailable:
        sock.close()
        return Unavailable(
            f"{name} to {self.address}: the metadata service did not answer ({exc or type(exc).__name__}); "
            "check that `kvstore meta` (or `kvstore serve`) is running"
        )


def _detail_error(body: bytes, what: str) -> KVStoreError:
    try:
        return convert.error_from_pb(pb.ErrorDetail.FromString(body))
    except Exception as exc:  # noqa: BLE001 - an undecodable error frame
        return Unavailable(f"{what}: the metadata service sent an undecodable error ({exc})")


def _grpc_error(exc: grpc.RpcError, what: str) -> KVStoreError:
    """The exact kvstore error when the service sent its ErrorDetail, else one mapped from the
    gRPC status (a transport failure, or a service that sends no detail)."""
    try:
        trailing = cast(grpc.Call, exc).trailing_metadata() or ()
    except AttributeError:  # not raised by a call: no metadata
        trailing = ()
    for key, value in trailing:
        if key == convert.ERROR_DETAIL_KEY and isinstance(value, bytes):
            return _detail_error(value, what)
    return from_rpc_error(exc, what)


def _still_idle(sock: socket.socket) -> bool:
    """Whether a pooled connection is open with nothing unread: readable means the service closed
    it (or broke the protocol). One poll, without touching the socket's timeout."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        return not poller.poll(0)
    except OSError:
        return False
