"""The daemon side of the `nixl` transport (see nixl_agent.py): registers every DRAM segment with
the daemon's agent once and serves nothing per request."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from kvstore.config import DaemonConfig
from kvstore.errors import TransportError
from kvstore.storage.base import SegmentStorage
from kvstore.transport import nixl_agent
from kvstore.transport.base import GrantChecker, TransportServer
from kvstore.transport.nixl_agent import format_address, start_agent
from kvstore.types import Endpoint, Tier


@dataclass
class _Region:
    """A registered segment: its address, its endpoint, and what keeps the mapping exported."""

    address: str
    registration: Any  # what deregister_memory takes back
    view: memoryview
    anchor: ctypes.c_char

    def release(self) -> None:
        del self.anchor  # drop the export first, or the view cannot be released
        self.view.release()


class NixlServer(TransportServer):
    """Owns one agent; registers every DRAM segment with it. Serves nothing per request, so the
    grant checker is unused (see nixl_agent's trust boundary). SSD segments are not memory, and
    GPU segments are not registered (yet: NIXL takes VRAM, untried here), so neither offers a
    nixl endpoint."""

    name = "nixl"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._backends = getattr(config, "nixl_backends", nixl_agent.DEFAULT_BACKENDS)
        self._ucx_tls = config.ucx_tls
        self._agent: Any = None
        self._regions: dict[str, _Region] = {}

    def start(self) -> None:
        self._agent = start_agent("daemon", self._backends, self._ucx_tls, progress_thread=True)

    def add_segment(self, segment: SegmentStorage) -> None:
        if segment.tier is not Tier.DRAM or segment.segment_id in self._regions:
            return
        if self._agent is None:
            raise TransportError("nixl: add_segment before start")
        view = segment.view(0, segment.capacity)
        if view is None:
            raise TransportError(f"nixl: segment {segment.segment_id} is not memory to register")
        anchor = ctypes.c_char.from_buffer(view)
        base = ctypes.addressof(anchor)
        try:
            registration = self._agent.register_memory([(base, segment.capacity, 0, "")], "DRAM")
            metadata = self._agent.get_partial_agent_metadata(registration, True)
        except Exception as exc:  # NIXL's own error types
            del anchor
            view.release()
            raise nixl_agent.wrap(f"registering segment {segment.segment_id} ({segment.capacity} bytes)", exc) from exc
        address = format_address(self._agent.name, base, metadata)
        self._regions[segment.segment_id] = _Region(address, registration, view, anchor)

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        region = self._regions.get(segment.segment_id)
        return Endpoint(self.name, region.address) if region is not None else None

    def stop(self) -> None:
        """Deregister every segment and drop the agent (its connections close with it)."""
        for region in self._regions.values():
            if self._agent is not None:
                self._agent.deregister_memory(region.registration)
            region.release()
        self._regions.clear()
        self._agent = None
