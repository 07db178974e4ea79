"""The fast lane: MetaService's own protobuf messages, framed over a plain TCP socket.

gRPC from Python costs ~0.4 ms per call here, ten times a loopback round trip, and the hot calls
(Exists, MatchPrefix, Get, PutStart, PutEnd) are what engines make per request. The fast lane
carries exactly the same request and response messages, so it adds no schema: only framing.

    request  = "<IH2x"  payload length, method id (METHOD_IDS), payload (the request message)
    response = "<IB3x"  payload length, status, payload
      status 0 (OK): the payload is the response message; otherwise the status is the
      kvstore.errors.ErrorCode of the failure and the payload an ErrorDetail message.

Method ids are pinned by name in METHOD_IDS (a test holds the table): a new RPC takes a new id,
an id is never reused or renumbered. Every connection opens with a HELLO frame (method id 0,
payload FastLaneHello, carrying the caller's token) that the service answers with
FastLaneWelcome, or with an error frame and a close when it does not speak the client's PROTOCOL
(the client then uses gRPC) or does not accept the token (UNAUTHENTICATED). One call at a
time per connection; a client keeps a small pool of connections.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from google.protobuf.message import Message

from kvstore.v1 import meta_pb2 as pb
from kvstore.wire.calls import CALLS

PROTOCOL = 2  # 1: method ids by declaration order, grpc status codes, no hello
REQUEST = struct.Struct("<IH2x")
RESPONSE = struct.Struct("<IB3x")
MAX_FRAME = 64 << 20
OK = 0
HELLO = 0

# Each call's id is its class's (kvstore.wire.calls), pinned there (and by a test).
METHOD_IDS: dict[str, int] = {name: cls.method_id for name, cls in CALLS.items()}


class Method(NamedTuple):
    id: int
    name: str
    request: type[Message]
    response: type[Message]


def _methods() -> dict[int, Method]:
    service = pb.DESCRIPTOR.services_by_name["MetaService"]
    missing = [m.name for m in service.methods if m.name not in METHOD_IDS]
    if missing:
        raise RuntimeError(f"fast lane: no method id for {missing}; add them to METHOD_IDS")
    return {
        METHOD_IDS[m.name]: Method(METHOD_IDS[m.name], m.name, getattr(pb, m.input_type.name),
                                   getattr(pb, m.output_type.name))
        for m in service.methods
    }  # fmt: skip


METHODS = _methods()
BY_NAME = {m.name: m for m in METHODS.values()}


class BadFrame(ValueError):
    """A header refused before its payload is read; `fields` are the header's."""

    def __init__(self, fields: tuple[int, ...]) -> None:
        super().__init__(f"bad frame header {fields}")
        self.fields = fields


_FIRST_READ = 65536
_PIECE = 1 << 20


def _recv_more(sock: socket.socket, data: bytearray, size: int) -> None:
    """Append to `data` until it holds `size` bytes. Memory grows with what has arrived, never
    with what a header announced; EOFError if the peer closes first."""
    while len(data) < size:
        more = sock.recv(min(size - len(data), _PIECE))
        if not more:
            raise EOFError("connection closed by the peer")
        data += more


def recv_frame(
    sock: socket.socket,
    header: struct.Struct,
    accept: Callable[[tuple[int, ...]], bool] = lambda fields: True,
    max_frame: int = MAX_FRAME,
    rest_timeout: float | None = None,
) -> tuple[tuple[int, ...], bytes]:
    """One frame: its header's fields (the payload length first) and its payload. A small frame
    (nearly every call) arrives with a single recv. BadFrame, before any payload is awaited, for
    a length over `max_frame` or a header `accept` refuses; EOFError if the peer closes first.
    With `rest_timeout`, a frame that does not come whole at once must finish within that long
    (socket.timeout after it); the socket's own timeout applies to the first byte."""
    first = sock.recv(_FIRST_READ)
    if not first:
        raise EOFError("connection closed by the peer")
    data = bytearray(first)
    if len(data) >= header.size and len(data) >= header.size + header.unpack_from(data)[0]:
        fields = header.unpack_from(data)  # the common case: all of it in one recv
        if fields[0] > max_frame or not accept(fields):
            raise BadFrame(fields)
        return fields, bytes(memoryview(data)[header.size : header.size + fields[0]])
    idle = sock.gettimeout()
    if rest_timeout is not None:
        sock.settimeout(rest_timeout)
    try:
        _recv_more(sock, data, header.size)
        fields = header.unpack_from(data)
        if fields[0] > max_frame or not accept(fields):
            raise BadFrame(fields)
        end = header.size + fields[0]
        _recv_more(sock, data, end)
    finally:
        if rest_timeout is not None:
            sock.settimeout(idle)
    return fields, bytes(memoryview(data)[header.size : end])


def send_frame(sock: socket.socket, header: bytes, payload: bytes) -> None:
    if len(payload) < 65536:
        sock.sendall(header + payload)
    else:
        sock.sendall(header)
        sock.sendall(payload)


def encode_request(name: str, message: Any) -> tuple[Method, bytes, bytes]:
    method = BY_NAME[name]
    payload = message.SerializeToString()
    return method, REQUEST.pack(len(payload), method.id), payload


def hello_frame(client_version: str, token: str = "") -> bytes:
    payload = pb.FastLaneHello(protocol=PROTOCOL, client_version=client_version, token=token).SerializeToString()
    return REQUEST.pack(len(payload), HELLO) + payload


def response_frame(body: bytes, status: int = OK) -> bytes:
    return RESPONSE.pack(len(body), status) + body
