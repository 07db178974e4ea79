"""The `tcp` transport's wire format and the blocking-socket helpers its client (tcp_client.py)
and daemon side (tcp_server.py) share. tcp is the data plane over plain TCP, for any host and no
extra dependencies.

Wire format, version 2, little-endian. A connection carries any number of requests, one at a
time; a request moves many blocks of one segment in one direction.

    request = REQUEST_HEADER  segment_id  ITEM * count  padding  [payload]
      REQUEST_HEADER "<4sBBHI"  magic b"KVTP", version 2, op (GrantMode: 1 READ, 2 WRITE),
                                len(segment_id) in 1..1024, count in 0..65536
      segment_id                UTF-8; the segment every item's grant names
      ITEM "<QQBBQ16s"          a grant (kvstore.grant.GRANT_ITEM): offset, length, mode, flags,
                                expires_ms, mac; the item moves exactly [offset, offset + length)
      padding                   zero bytes up to a multiple of 16 from the request's start
      payload                   WRITE only: the items' bytes back to back, in item order
    reply   = REPLY_HEADER  message  [payload]
      REPLY_HEADER "<4sBBxxI4x" magic, version, status (kvstore.errors.ErrorCode), len(message)
      message                   UTF-8, at most 64 KiB; empty on OK
      payload                   with status OK: READ, the items' bytes in item order; WRITE, a
                                16-byte receipt per item (kvstore.grant), for the writer's PutEnd

Headers are padded to 16 bytes so that a payload keeps its alignment through the kernel's socket
buffers: a payload 12 bytes off alignment made loopback copies about twice as slow.

A READ of no items is a ping (the link monitor's probe): answered OK, with nothing.

The daemon checks every grant of a request before it moves any byte, and takes a WRITE's grants
(each writes once). A refused READ gets an error reply and the connection stays usable; a refused
WRITE gets an error reply and a close, unread, since its payload is already in flight. A
malformed header gets an error reply and a close. Every byte of a request must move before its
first grant expires (the space may then belong to another key): a payload that has not fully
arrived, or been taken, by then is cut off with the connection, and a write gets no receipt. A
connection idle for the daemon's idle timeout, or whose request header and table take longer
than its header timeout, is closed; past its connection caps a daemon answers UNAVAILABLE and
closes. Payload moves straight between the socket and segment views on the daemon (through one
bounce piece for tiers without a view), and the caller's buffers on the client.

Endpoint address: "host:port" ("[host]:port" for IPv6).
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from collections.abc import Sequence

from kvstore.checksum import PIECE, hasher
from kvstore.errors import ErrorCode, InvalidArgument, TransportError, error_for
from kvstore.grant import GRANT_ITEM, RECEIPT_BYTES, pack_grants
from kvstore.types import Grant, GrantMode

MAGIC = b"KVTP"
VERSION = 2
REQUEST_HEADER = struct.Struct("<4sBBHI")
ITEM = GRANT_ITEM
RECEIPT = RECEIPT_BYTES  # per item of a WRITE's OK reply
REPLY_HEADER = struct.Struct("<4sBBxxI4x")
MAX_ITEMS = 65536
MAX_SEGMENT_ID_BYTES = 1024
MAX_MESSAGE_BYTES = 64 << 10

_IOV_MAX = 1024  # buffers per sendmsg / recvmsg_into call (Linux IOV_MAX)
_SOCKET_BUFFER = 4 << 20
_TIMEVAL = struct.Struct("@ll")

# Sockets stay blocking, so one MSG_WAITALL receive fills a whole batch of buffers. Deadlines are
# enforced by the kernel (SO_SNDTIMEO / SO_RCVTIMEO, re-armed before every call): the client's,
# and on the daemon the grants' expiry and its idle and header timeouts. A TLS socket (the `tls`
# transport) has neither sendmsg nor recvmsg_into: it moves one buffer at a time, under Python's
# own socket timeout set from the same deadlines.


def arm(sock: socket.socket, option: int, deadline: float | None) -> None:
    """Bound the next blocking call by the time left until `deadline`; TimeoutError if none is."""
    if isinstance(sock, ssl.SSLSocket):
        sock.settimeout(None if deadline is None else _left(deadline))
        return
    if deadline is not None:
        remaining = _left(deadline)
        seconds = int(remaining)
        micros = max(1, int((remaining - seconds) * 1e6))  # a zero timeval means "never"
        sock.setsockopt(socket.SOL_SOCKET, option, _TIMEVAL.pack(seconds, micros))


def _left(deadline: float) -> float:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline passed")
    return remaining


def advance(pending: list[memoryview], i: int, done: int) -> int:
    """Index of the first unfinished buffer after `done` more bytes of pending[i:] moved."""
    while done:
        size = pending[i].nbytes
        if done < size:
            pending[i] = pending[i][done:]
            return i
        done -= size
        i += 1
    return i


def send_buffers(sock: socket.socket, buffers: Sequence[bytes | memoryview], deadline: float | None) -> None:
    """Send the buffers in order, gathered by sendmsg rather than joined."""
    pending = [v for v in (memoryview(b).cast("B") for b in buffers) if v.nbytes]
    if isinstance(sock, ssl.SSLSocket):
        for view in pending:
            arm(sock, socket.SO_SNDTIMEO, deadline)
            sock.sendall(view)
        return
    i = 0
    while i < len(pending):
        arm(sock, socket.SO_SNDTIMEO, deadline)
        try:
            i = advance(pending, i, sock.sendmsg(pending[i : i + _IOV_MAX]))
        except BlockingIOError:  # the kernel timeout fired; arm decides if time is up
            pass


def recv_buffers(sock: socket.socket, buffers: Sequence[memoryview], deadline: float | None) -> None:
    """Fill the buffers in order straight from the socket; ConnectionError on EOF."""
    pending = [b for b in buffers if b.nbytes]
    if isinstance(sock, ssl.SSLSocket):
        for view in pending:
            view = view.cast("B")
            done = 0
            while done < view.nbytes:
                arm(sock, socket.SO_RCVTIMEO, deadline)
                got = sock.recv_into(view[done:])
                if got == 0:
                    raise ConnectionError("connection closed by the peer mid-frame")
                done += got
        return
    i = 0
    while i < len(pending):
        arm(sock, socket.SO_RCVTIMEO, deadline)
        try:
            got = sock.recvmsg_into(pending[i : i + _IOV_MAX], 0, socket.MSG_WAITALL)[0]
        except BlockingIOError:
            continue
        if got == 0:
            raise ConnectionError("connection closed by the peer mid-frame")
        i = advance(pending, i, got)


def recv_hashed(sock: socket.socket, buffers: Sequence[memoryview], deadline: float | None) -> list[int]:
    """Fill the buffers like recv_buffers, hashing each piece as it lands (still in cache);
    returns each buffer's checksum. Small buffers are received together, large ones piecewise."""
    digests = []
    for buf in buffers:
        h = hasher()
        for start in range(0, buf.nbytes, PIECE):
            piece = buf[start : start + PIECE]
            recv_buffers(sock, [piece], deadline)
            h.update(piece)
        digests.append(h.intdigest())
    return digests


def recv_exact(sock: socket.socket, size: int, deadline: float | None) -> bytearray:
    """Exactly `size` bytes. Memory grows with what arrives, a piece at a time, never with what
    a peer announced: a header claiming megabytes costs nothing until they come."""
    buf = bytearray()
    while len(buf) < size:
        arm(sock, socket.SO_RCVTIMEO, deadline)
        try:
            # recv(n) takes what has arrived (up to n) into memory it does not touch beforehand:
            # a connection that announced a megabyte and sent 20 bytes holds about 20 bytes.
            piece = sock.recv(min(size - len(buf), PIECE))
        except BlockingIOError:
            continue
        if not piece:
            raise ConnectionError("connection closed by the peer mid-frame")
        buf += piece
    return buf


def encode_reply(code: ErrorCode, message: str) -> bytes:
    text = message.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES]
    return REPLY_HEADER.pack(MAGIC, VERSION, int(code), len(text)) + text


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        if sock.getsockopt(socket.SOL_SOCKET, option) < _SOCKET_BUFFER:
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)


def table_bytes(id_len: int, count: int) -> int:
    """Bytes between a request header and its payload: segment id, items and padding."""
    unpadded = REQUEST_HEADER.size + id_len + count * ITEM.size
    return unpadded + (-unpadded % 16) - REQUEST_HEADER.size


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def encode_request(segment_id: str, mode: GrantMode, grants: Sequence[Grant]) -> bytes:
    """Request header and item table; a WRITE payload follows it unjoined."""
    sid = segment_id.encode()
    if not 0 < len(sid) <= MAX_SEGMENT_ID_BYTES:
        raise InvalidArgument(f"segment id of {len(sid)} bytes; tcp allows 1..{MAX_SEGMENT_ID_BYTES}")
    items = pack_grants(grants)
    head = REQUEST_HEADER.pack(MAGIC, VERSION, int(mode), len(sid), len(grants))
    padding = bytes(table_bytes(len(sid), len(grants)) - len(sid) - len(items))
    return b"".join([head, sid, items, padding])


def read_reply(sock: socket.socket, deadline: float, address: str) -> None:
    """Consume one reply header and message; raise the typed error it carries unless OK."""
    magic, version, status, size = REPLY_HEADER.unpack(recv_exact(sock, REPLY_HEADER.size, deadline))
    if magic != MAGIC or version != VERSION or size > MAX_MESSAGE_BYTES:
        raise TransportError(f"{address} sent a malformed reply; is it a kvstore tcp daemon of this version?")
    message = recv_exact(sock, size, deadline).decode("utf-8", "replace")
    if status != ErrorCode.OK:
        code = status if status in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
        raise error_for(code, f"daemon at {address}: {message}")


def parse_header(head: bytes) -> tuple[GrantMode, int, int]:
    """(op, segment id length, item count) of a request header; InvalidArgument if malformed."""
    magic, version, op, id_len, count = REQUEST_HEADER.unpack(head)
    if (
        magic != MAGIC
        or version != VERSION
        or op not in (GrantMode.READ, GrantMode.WRITE)
        or not 0 < id_len <= MAX_SEGMENT_ID_BYTES
        or count > MAX_ITEMS
    ):
        raise InvalidArgument(
            f"malformed tcp request header (magic {bytes(magic)!r}, version {version}, "
            f"op {op}, segment id of {id_len} bytes, {count} items)"
        )
    return GrantMode(op), id_len, count
