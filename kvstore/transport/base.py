"""The data-plane interface.

Client side (`Transport`): move bytes between caller memory and granted ranges of a daemon's
segment. Daemon side (`TransportServer`): accept such requests for the daemon's segments, checking
every grant. Implementations register by name in registry.py and are imported lazily.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from kvstore.config import ClientConfig
from kvstore.grant import GrantSigner
from kvstore.storage.base import SegmentStorage
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo


@dataclass(frozen=True)
class Transfer:
    """One block to move: the grant names the remote range, `buffer` the local bytes.

    For a write, buffer is the source; for a read, the destination. len(buffer) == grant.length.
    """

    grant: Grant
    buffer: memoryview


def checked_view(segment: SegmentInfo, t: Transfer, mode: GrantMode, transport: str) -> memoryview:
    """t.buffer as flat bytes, after checking that it fits its grant and `mode`."""
    from kvstore.errors import InvalidArgument

    g, buf = t.grant, t.buffer
    if g.segment_id != segment.segment_id or g.mode != mode:
        raise InvalidArgument(f"grant for {g.segment_id}/{g.mode.name} used for "
                              f"{segment.segment_id}/{mode.name}")
    if not buf.c_contiguous or (mode is GrantMode.READ and buf.readonly):
        raise InvalidArgument(f"{transport} transfers need C-contiguous buffers, writable for a read")
    if buf.nbytes != g.length:
        raise InvalidArgument(f"buffer of {buf.nbytes} bytes does not match grant [{g.offset}, +{g.length})")
    return buf.cast("B")


class Transport(ABC):
    """Client side of one transport. Thread safe; holds connections/mappings for reuse."""

    name: ClassVar[str]

    @classmethod
    def from_config(cls, config: ClientConfig) -> "Transport":
        """The transport as a client with `config` uses it (most need nothing from it)."""
        return cls()

    def can_reach(self, segment: SegmentInfo) -> bool:
        """Whether this transport can reach `segment` from here (cheap; no I/O beyond a stat)."""
        return segment.endpoint(self.name) is not None

    @abstractmethod
    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        """Write every transfer's buffer into its granted range; raise TransportError,
        PermissionDenied or InvalidArgument on failure (then any subset may have been written).
        `deadline` is a time.monotonic() value. May return the checksum of each buffer, computed
        while copying (cheaper than a second pass); None leaves that to the caller."""

    @abstractmethod
    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        """Fill every transfer's buffer from its granted range; errors and the returned
        checksums (of the bytes read) as for write."""

    def forget(self, segment_id: str) -> None:
        """Drop cached state (connections, mappings) for a segment that went away."""

    def close(self) -> None:
        """Release everything this transport holds."""


class GrantChecker:
    """What a daemon-side server asks before touching segment bytes."""

    def __init__(self, signer: GrantSigner, segments: Callable[[str], SegmentStorage | None],
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._signer = signer
        self._segments = segments
        self._clock_ms = clock_ms

    def check(self, grant: Grant, mode: GrantMode) -> SegmentStorage:
        """The segment the grant is for, or PermissionDenied / KeyNotFound-free refusal."""
        from kvstore.errors import PermissionDenied

        seg = self._segments(grant.segment_id)
        if seg is None:
            raise PermissionDenied(f"segment {grant.segment_id!r} is not served by this daemon")
        self._signer.check(grant, mode, self._clock_ms(), seg.capacity)
        return seg


class TransportServer(ABC):
    """Daemon side of one transport. Constructed as cls(checker: GrantChecker, config: DaemonConfig);
    every request that touches segment bytes goes through checker.check first."""

    name: ClassVar[str]

    @abstractmethod
    def start(self) -> None:
        """Begin serving (bind listeners, register memory). Returns once ready."""

    @abstractmethod
    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        """The endpoint clients use to reach `segment`, or None if this transport can't serve it."""

    def add_segment(self, segment: SegmentStorage) -> None:
        """Serve `segment` (register its memory if the transport needs to). Called after start()
        for every segment the daemon holds, before endpoint() is asked for it."""

    @abstractmethod
    def stop(self) -> None:
        """Stop serving and release resources; open connections are closed."""
