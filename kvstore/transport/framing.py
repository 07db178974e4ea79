"""Framing for the `tcp` transport: the wire format's constants and blocking-socket helpers
shared by the client and the daemon (the format itself is described in tcp.py)."""

from __future__ import annotations

import socket
import struct
import time
from typing import Sequence

from kvstore.checksum import hasher
from kvstore.errors import ErrorCode
from kvstore.grant import MAC_BYTES

MAGIC = b"KVTP"
VERSION = 1
REQUEST_HEADER = struct.Struct("<4sBBHI")
ITEM = struct.Struct(f"<QQBQ{MAC_BYTES}s")
REPLY_HEADER = struct.Struct("<4sBBxxI4x")
MAX_ITEMS = 65536
MAX_SEGMENT_ID_BYTES = 1024
MAX_MESSAGE_BYTES = 64 << 10

_HASH_PIECE = 1 << 20         # reads of blocks this large are hashed piece by piece as they land
_IOV_MAX = 1024                 # buffers per sendmsg / recvmsg_into call (Linux IOV_MAX)
_SOCKET_BUFFER = 4 << 20
_TIMEVAL = struct.Struct("@ll")

# Sockets stay blocking, so one MSG_WAITALL receive fills a whole batch of buffers. A client's
# deadline is enforced by the kernel (SO_SNDTIMEO / SO_RCVTIMEO, re-armed before every call);
# the daemon passes deadline None and blocks until its peer sends or goes away.


def _arm(sock: socket.socket, option: int, deadline: float | None) -> None:
    """Bound the next blocking call by the time left until `deadline`; TimeoutError if none is."""
    if deadline is not None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        seconds = int(remaining)
        micros = max(1, int((remaining - seconds) * 1e6))       # a zero timeval means "never"
        sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(seconds, micros))


def _advance(pending: list[memoryview], i: int, done: int) -> int:
    """Index of the first unfinished buffer after `done` more bytes of pending[i:] moved."""
    while done:
        size = pending[i].nbytes
        if done < size:
            pending[i] = pending[i][done:]
            return i
        done -= size
        i += 1
    return i


def _send_buffers(sock: socket.socket, buffers: Sequence[bytes | memoryview], deadline: float | None) -> None:
    """Send the buffers in order, gathered by sendmsg rather than joined."""
    pending = [v for v in (memoryview(b).cast("B") for b in buffers) if v.nbytes]
    i = 0
    while i < len(pending):
        _arm(sock, socket.SO_SNDTIMEO, deadline)
        try:
            i = _advance(pending, i, sock.sendmsg(pending[i:i + _IOV_MAX]))
        except BlockingIOError:          # the kernel timeout fired; _arm decides if time is up
            pass


def _recv_buffers(sock: socket.socket, buffers: Sequence[memoryview], deadline: float | None) -> None:
    """Fill the buffers in order straight from the socket; ConnectionError on EOF."""
    pending = [b for b in buffers if b.nbytes]
    i = 0
    while i < len(pending):
        _arm(sock, socket.SO_RCVTIMEO, deadline)
        try:
            got = sock.recvmsg_into(pending[i:i + _IOV_MAX], 0, socket.MSG_WAITALL)[0]
        except BlockingIOError:
            continue
        if got == 0:
            raise ConnectionError("connection closed by the peer mid-frame")
        i = _advance(pending, i, got)


def _recv_hashed(sock: socket.socket, buffers: Sequence[memoryview], deadline: float | None) -> list[int]:
    """Fill the buffers like _recv_buffers, hashing each piece as it lands (still in cache);
    returns each buffer's checksum. Small buffers are received together, large ones piecewise."""
    digests = []
    for buf in buffers:
        h = hasher()
        for start in range(0, buf.nbytes, _HASH_PIECE):
            piece = buf[start:start + _HASH_PIECE]
            _recv_buffers(sock, [piece], deadline)
            h.update(piece)
        digests.append(h.intdigest())
    return digests


def _recv_exact(sock: socket.socket, size: int, deadline: float | None) -> bytearray:
    buf = bytearray(size)
    _recv_buffers(sock, [memoryview(buf)], deadline)
    return buf


def _reply(code: ErrorCode, message: str) -> bytes:
    text = message.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES]
    return REPLY_HEADER.pack(MAGIC, VERSION, int(code), len(text)) + text


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        if sock.getsockopt(socket.SOL_SOCKET, option) < _SOCKET_BUFFER:
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)


def _table_bytes(id_len: int, count: int) -> int:
    """Bytes between a request header and its payload: segment id, items and padding."""
    unpadded = REQUEST_HEADER.size + id_len + count * ITEM.size
    return unpadded + (-unpadded % 16) - REQUEST_HEADER.size


def _join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
