"""Shared by the `ucx` client (ucx_client.py) and daemon (ucx_server.py): the wire format's constants
(described in ucx_client.py), tags, status messages, and the UCX worker as both sides drive it."""

from __future__ import annotations

import importlib.util
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.errors import ErrorCode, TransportError, Unavailable, error_for
from kvstore.grant import GRANT_ITEM, RECEIPT_BYTES

# ucxx takes 0.6 s to import, so it is imported on first use; a missing one fails here, at once.
if importlib.util.find_spec("ucxx") is None:
    raise ImportError("No module named 'ucxx'")

MAGIC = b"KVUX"
VERSION = 2
HEADER = struct.Struct("<4sBBHIII")
ITEM = GRANT_ITEM
HELLO = struct.Struct("<IHH")
STATUS = struct.Struct("<4sBBxxIQ")
OP_READ, OP_WRITE, OP_HELLO, OP_BYE = 1, 2, 3, 4
KIND_CTRL, KIND_STATUS, KIND_DATA = 1, 2, 3
PIECE = 1 << 20
MAX_ITEMS = 1024  # per request; a larger batch is several requests
MAX_SEGMENT_ID_BYTES = 1024
MAX_MESSAGE_BYTES = 4096
MAX_CTRL_BYTES = HEADER.size + MAX_SEGMENT_ID_BYTES + MAX_ITEMS * ITEM.size
STATUS_BYTES = STATUS.size + MAX_MESSAGE_BYTES

_SHARED_MEMORY_TLS = {"sm", "shm", "sysv", "posix", "cma", "knem", "xpmem"}
POLL_MS = 50  # longest sleep between liveness checks


def tag(conn_id: int, seq: int, kind: int) -> int:
    return ((conn_id & 0xFFFFFF) << 40) | ((seq & 0xFFFFFFFF) << 8) | kind


def _ucxx() -> tuple[Any, Any]:
    """(libucxx, Array), imported once. UCX reads its environment when ucxx loads it."""
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")  # else a warning lands on stdout
    try:
        from ucxx._lib import libucxx
        from ucxx._lib.arr import Array
    except ImportError as exc:
        raise Unavailable(
            f"transport 'ucx' needs UCX, which does not load ({exc}); run: pip install 'kvcachestore[ucx]'"
        ) from exc
    return libucxx, Array


class Worker:
    """A UCX context and one worker on it, in blocking-progress mode. Not thread safe: one
    thread at a time (the daemon's loop, or a client call holding its transport's lock)."""

    def __init__(self, tls: str) -> None:
        self.L, self.Array = _ucxx()
        self.context = self.L.UCXContext(
            config_dict={"TLS": tls}, feature_flags=(self.L.Feature.TAG, self.L.Feature.WAKEUP)
        )
        self.worker = self.L.UCXWorker(self.context)
        self.worker.init_blocking_progress_mode()
        self.address = self.worker.address.tobytes()
        self.full_mask = self.L.UCXXTagMaskFull
        self._closing: list[Any] = []  # close requests, kept until they complete

    def connect(self, address: bytes) -> Any:
        return self.worker.create_endpoint_from_worker_address(self.L.UCXAddress.create_from_buffer(address), False)

    def send(self, ep: Any, buf: Any, tag_: int) -> tuple[Any, Any]:
        """(request, the Array keeping `buf` alive until the request completes)."""
        arr = self.Array(buf)
        return ep.tag_send(arr, self.L.UCXXTag(tag_)), arr

    def recv(self, ep: Any, buf: Any, tag_: int) -> tuple[Any, Any]:
        arr = self.Array(buf)
        return ep.tag_recv(arr, self.L.UCXXTag(tag_), self.full_mask), arr

    def close(self, peer: Peer) -> None:
        """Close a peer's endpoint, once (a second close crashes the process). The requests
        posted through it that have not started are cancelled; one already receiving may still
        complete, so whoever gives up on a receive must not reuse its buffer (ucx_client.py stages)."""
        if not peer.closed:
            peer.closed = True
            self._closing = [r for r in self._closing if not r.completed]
            self._closing.append(peer.ep.close())

    @property
    def closing(self) -> bool:
        return any(not r.completed for r in self._closing)

    def settle(self, seconds: float) -> None:
        """Progress until every close completed, for at most `seconds` (a dead peer's may never)."""
        give_up = time.monotonic() + seconds
        while self.closing and time.monotonic() < give_up:
            self.progress(10)

    def progress(self, wait_ms: int) -> bool:
        """Progress while there is work (a bounded while); if there was none, sleep in epoll up
        to wait_ms. Fragmented protocols need many steps: one epoll wake-up each would crawl."""
        if self.worker.progress_once():
            for _ in range(256):
                if not self.worker.progress_once():
                    break
            return True
        self.worker.progress_worker_event(wait_ms)
        return False


def window(tls: str) -> int:
    """Payload bytes in flight per request for these UCX transports."""
    return PIECE if _SHARED_MEMORY_TLS & {t.strip() for t in tls.split(",")} else 8 * PIECE


def encode_status(code: ErrorCode, message: str | bytes = "", value: int = 0) -> bytearray:
    """A STATUS message: the outcome of a request's phase; `value` carries a hello's connection
    id; `message` is an error's text, or for the final OK of a WRITE its receipts (bytes)."""
    text = message.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES] if isinstance(message, str) else message
    return bytearray(STATUS.pack(MAGIC, VERSION, int(code), len(text), value) + text)


def pieces(buffers: Sequence[memoryview]) -> list[tuple[int, memoryview]]:
    """(buffer index, slice) of each piece, in wire order."""
    return [(i, buf[k : k + PIECE]) for i, buf in enumerate(buffers) for k in range(0, buf.nbytes, PIECE)]


def parse_address(address: str) -> tuple[bytes, str, int]:
    """(worker address, host id, pid) of an endpoint address."""
    worker, host, pid = address.split("|", 2)
    return bytes.fromhex(worker), host, int(pid)


def status_bytes(items: int) -> int:
    """Room for a STATUS: an error's text, or the receipts of a WRITE of `items` grants."""
    return STATUS.size + max(MAX_MESSAGE_BYTES, RECEIPT_BYTES * items)


def status_payload(buf: bytearray) -> bytes:
    """The message bytes of a received STATUS (a WRITE's receipts)."""
    size = STATUS.unpack_from(buf)[3]
    return bytes(buf[STATUS.size : STATUS.size + size])


def check_status(buf: bytearray) -> int:
    """The value of a received STATUS, or the typed error it carries."""
    magic, version, code, size, value = STATUS.unpack_from(buf)
    if magic != MAGIC or version != VERSION or STATUS.size + size > len(buf):
        raise TransportError("malformed ucx status; is the daemon a kvstore daemon of this version?")
    if code != ErrorCode.OK:
        code = code if code in ErrorCode._value2member_map_ else ErrorCode.INTERNAL
        message = bytes(buf[STATUS.size : STATUS.size + size]).decode("utf-8", "replace")
        raise error_for(code, f"ucx daemon: {message}")
    return int(value)


@dataclass
class Peer:
    """The other end of a connection: a daemon (client side) or a client (daemon side)."""

    ep: Any
    pid: int
    local: bool  # same host: its pid tells whether it lives
    conn_id: int = 0
    closed: bool = False  # closed through Worker.close
