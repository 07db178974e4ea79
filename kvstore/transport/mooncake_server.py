"""The daemon side of the `mooncake` transport (see mooncake_engine.py): registers every DRAM
segment with the daemon's engine once and serves nothing per request."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from kvstore.config import DaemonConfig
from kvstore.errors import TransportError
from kvstore.storage.base import SegmentStorage
from kvstore.transport.base import GrantChecker, TransportServer
from kvstore.transport.mooncake_engine import (
    TransferEngine,
    advertised_host,
    format_address,
    new_incarnation,
    start_engine,
)
from kvstore.types import Endpoint, Tier


@dataclass
class _Region:
    """A registered segment: its base address, and the objects that keep the mapping exported."""

    base: int
    view: memoryview
    anchor: ctypes.c_char

    def release(self) -> None:
        del self.anchor  # drop the export first, or the view cannot be released
        self.view.release()


class MooncakeServer(TransportServer):
    """Owns one engine; registers every DRAM segment with it. Serves nothing per request, so the
    grant checker is unused (see the module's trust boundary)."""

    name = "mooncake"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._host = advertised_host(config.host)
        self._protocol = config.mooncake_protocol
        self._device = config.mooncake_device
        self._engine: TransferEngine | None = None
        self._session = ""
        self._incarnation = ""  # this engine start's name: its session name may be a dead engine's
        self._regions: dict[str, _Region] = {}

    def start(self) -> None:
        self._engine = start_engine(self._host, self._protocol, self._device)
        self._session = f"{self._host}:{self._engine.get_rpc_port()}"
        self._incarnation = new_incarnation()

    def add_segment(self, segment: SegmentStorage) -> None:
        if segment.tier is not Tier.DRAM or segment.segment_id in self._regions:
            return
        if self._engine is None:
            raise TransportError("mooncake: add_segment before start")
        view = segment.view(0, segment.capacity)
        if view is None:
            raise TransportError(f"mooncake: segment {segment.segment_id} is not memory to register")
        anchor = ctypes.c_char.from_buffer(view)
        region = _Region(ctypes.addressof(anchor), view, anchor)
        rc = self._engine.register_memory(region.base, segment.capacity)
        if rc != 0:
            region.release()
            raise TransportError(
                f"mooncake: registering segment {segment.segment_id} ({segment.capacity} bytes) failed with rc {rc}"
            )
        self._regions[segment.segment_id] = region

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        region = self._regions.get(segment.segment_id)
        if region is None:
            return None
        return Endpoint(self.name, format_address(self._protocol, region.base, self._session, self._incarnation))

    def stop(self) -> None:
        """Unregister every segment and shut the engine (its ports close with it)."""
        for region in self._regions.values():
            if self._engine is not None:
                self._engine.unregister_memory(region.base)
            region.release()
        self._regions.clear()
        self._engine = None
