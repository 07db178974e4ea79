"""Staging memory for the nixl transport's client: the only client memory it registers with its
agent (Staging says why)."""

from __future__ import annotations

import logging
import threading
from typing import Any, NamedTuple

import numpy as np

from kvstore.errors import TransportError

STAGING_BYTES = 64 << 20  # bytes per staging buffer: the most one transfer moves
KEPT = 4  # idle staging buffers kept per transport
log = logging.getLogger(__name__)


class Buffer(NamedTuple):
    array: np.ndarray[Any, np.dtype[np.uint8]]
    registration: Any  # what deregister_memory takes back

    @property
    def address(self) -> int:
        return int(self.array.ctypes.data)


class Staging:
    """A few 64 MiB buffers, each registered once with the agent and reused call after call (a
    registration costs a UCX memory map, and on RDMA pins the pages: too dear per call).

    The caller's own buffers are never registered: a transfer NIXL could not cancel (its handle
    would not release) may still touch its local memory, so that buffer is set aside for good
    instead of being reused or freed; with the caller's memory that could not be done."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self._idle: list[Buffer] = []
        self._lock = threading.Lock()
        self.abandoned: list[Buffer] = []

    def take(self) -> Buffer:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        array = np.empty(STAGING_BYTES, np.uint8)
        try:
            registration = self._agent.register_memory([(array.ctypes.data, STAGING_BYTES, 0, "")], "DRAM")
        except Exception as exc:  # NIXL's own error types
            raise TransportError(f"nixl: registering a staging buffer failed: {exc}") from exc
        return Buffer(array, registration)

    def give_back(self, buf: Buffer, settled: bool) -> None:
        with self._lock:
            if not settled:
                self.abandoned.append(buf)
                log.warning(
                    "nixl: a transfer NIXL could not cancel may still touch %d MiB of staging memory; "
                    "it is set aside for good (%d so far)",
                    STAGING_BYTES >> 20,
                    len(self.abandoned),
                )
                return
            if len(self._idle) < KEPT:
                self._idle.append(buf)
                return
        self._agent.deregister_memory(buf.registration)

    def release(self) -> None:
        """Deregister and drop the idle buffers."""
        with self._lock:
            idle, self._idle = self._idle, []
        for buf in idle:
            self._agent.deregister_memory(buf.registration)
