"""Staging memory for the mooncake transport's client: the only client memory it hands to the
Transfer Engine (Staging says why)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from kvstore.errors import TransportError

STAGING_BYTES = 64 << 20  # bytes per staging buffer: the most one round moves
KEPT = 4  # idle staging buffers kept per transport
log = logging.getLogger(__name__)


class Staging:
    """Registered memory the engine moves bytes through: a few 64 MiB buffers, each registered
    once (on rdma; tcp needs no registration) with one engine and reused call after call.

    Nothing else is handed to the engine, because it keeps going after a call fails: measured
    here, a read that returned -1 from a stopped daemon had another 200 MiB land in its buffer
    once the daemon resumed. A buffer of a failed call is therefore never reused nor freed (the
    engine might write to it, or read it, after it was unmapped)."""

    def __init__(self, register: bool, abandoned: list[np.ndarray] | None = None) -> None:
        self._register = register
        self._idle: list[np.ndarray] = []
        self._lock = threading.Lock()
        self._retired_from: Any | None = None  # the engine this staging was retired from
        # Handed on to the staging that replaces this one: set aside for good means that.
        self.abandoned: list[np.ndarray] = [] if abandoned is None else abandoned

    def take(self, engine: Any) -> np.ndarray:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        buf = np.empty(STAGING_BYTES, np.uint8)
        if self._register and engine.register_memory(buf.ctypes.data, STAGING_BYTES) != 0:
            raise TransportError("mooncake: registering a staging buffer failed")
        return buf

    def give_back(self, buf: np.ndarray, clean: bool) -> None:
        with self._lock:
            if not clean:
                self.abandoned.append(buf)
                log.warning(
                    "mooncake: a failed transfer may still touch %d MiB of staging memory; "
                    "it is set aside for good (%d so far)",
                    STAGING_BYTES >> 20,
                    len(self.abandoned),
                )
                return
            if self._retired_from is None:
                if len(self._idle) < KEPT:
                    self._idle.append(buf)
                return
            engine = self._retired_from
        if self._register:
            engine.unregister_memory(buf.ctypes.data)

    def release(self, engine: Any | None) -> None:
        """Unregister and drop the idle buffers."""
        with self._lock:
            idle, self._idle = self._idle, []
        if engine is not None and self._register:
            for buf in idle:
                engine.unregister_memory(buf.ctypes.data)

    def retire(self, engine: Any) -> None:
        """Release the idle buffers, and every buffer given back from now on: the client moved
        to another engine, and calls still in flight on `engine` give theirs back here."""
        with self._lock:
            self._retired_from = engine
        self.release(engine)
