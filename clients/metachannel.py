"""How a client reaches the metadata service: gRPC, plus the service's fast lane when it offers
one (kvstore/fastrpc.py: the same messages over a plain socket, ~10x cheaper per call)."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from typing import Any

import grpc

from kvstore import fastrpc
from kvstore.errors import Unavailable, from_rpc_error, from_status
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
_GRPC_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
_STATUS = {code.value[0]: code for code in grpc.StatusCode}
_RETRY_LANE_AFTER_S = 5.0
_MAX_IDLE = 8


class MetaChannel:
    """Thread safe. `call(name, request)` runs one MetaService call and returns its response, or
    raises the kvstore error for its failure."""

    def __init__(self, address: str, timeout_s: float, fast_lane: bool = True) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=_GRPC_OPTIONS)
        self._stub = pb_grpc.MetaServiceStub(self._channel)
        self._want_lane = fast_lane
        self._lane_port: int | None = None          # None: not asked yet; 0: none offered
        self._lane_down_until = 0.0
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()

    def call(self, name: str, request: Any) -> Any:
        port = self._fast_lane_port()
        if port and time.monotonic() >= self._lane_down_until:
            sock = self._checkout(port)
            if sock is not None:
                return self._call_lane(sock, name, request)
        try:
            return getattr(self._stub, name)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, f"{name} to {self.address}") from exc

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
        self._channel.close()

    def _fast_lane_port(self) -> int:
        if self._lane_port is None and self._want_lane:
            try:
                info = self._stub.ServiceInfo(pb.ServiceInfoRequest(), timeout=self.timeout_s)
                self._lane_port = info.fast_lane_port
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:   # an older service has no lane
                    raise from_rpc_error(exc, f"ServiceInfo to {self.address}") from exc
                self._lane_port = 0
        return self._lane_port or 0

    def _checkout(self, port: int) -> socket.socket | None:
        with self._lock:
            while self._idle:
                sock = self._idle.pop()
                if _still_idle(sock):
                    return sock
                sock.close()
        host = self.address.rsplit(":", 1)[0].strip("[]")
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
        except OSError as exc:
            log.warning("fast lane %s:%d unreachable (%s); using gRPC for %.0f s", host, port, exc,
                        _RETRY_LANE_AFTER_S)
            self._lane_down_until = time.monotonic() + _RETRY_LANE_AFTER_S
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _call_lane(self, sock: socket.socket, name: str, request: Any) -> Any:
        method, header, payload = fastrpc.encode_request(name, request)
        try:
            fastrpc.send_frame(sock, header, payload)
            (_, status), body = fastrpc.recv_frame(sock, fastrpc.RESPONSE)
        except (OSError, EOFError, fastrpc.BadFrame) as exc:
            sock.close()
            raise Unavailable(f"{name} to {self.address}: the metadata service did not answer ({exc}); "
                              "check that `kvstore meta` (or `kvstore serve`) is running") from exc
        with self._lock:
            if len(self._idle) < _MAX_IDLE:
                self._idle.append(sock)
                sock = None
        if sock is not None:
            sock.close()
        if status != fastrpc.OK:
            raise from_status(_STATUS.get(status, grpc.StatusCode.UNKNOWN), body.decode("utf-8", "replace"),
                              f"{name} to {self.address}")
        return method.response.FromString(body)


def _still_idle(sock: socket.socket) -> bool:
    """Whether a pooled connection is open with nothing unread: readable means the service closed
    it (or broke the protocol). One poll, without touching the socket's timeout."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        return not poller.poll(0)
    except OSError:
        return False
