"""The tier interface: the bytes behind one segment on a daemon.

A segment is a fixed-size region the metadata service allocates blocks in; the daemon only stores
and moves bytes at offsets it is told (under a grant). Transports use `view()` when a tier is
memory backed (zero copy: recv_into / sendall straight from it) and `read_into` / `write_from`
otherwise.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from kvstore.results import Block
from kvstore.types import Tier


class SegmentStorage(ABC):
    segment_id: str
    tier: Tier
    capacity: int

    def view(self, offset: int, length: int) -> memoryview | None:
        """A writable view of [offset, offset+length) if the tier is memory backed, else None.

        The view aliases segment memory: writes through it are writes to the segment.
        """
        return None

    def readable(self, offset: int, length: int) -> memoryview:
        """The bytes of [offset, offset+length) to send: a view of segment memory when the tier
        is memory backed, else a fresh copy."""
        view = self.view(offset, length)
        if view is None:
            view = memoryview(bytearray(length))
            self.read_into(offset, view)
        return view

    @abstractmethod
    def read_into(self, offset: int, dest: memoryview) -> None:
        """Copy len(dest) bytes starting at `offset` into dest."""

    @abstractmethod
    def write_from(self, offset: int, src: memoryview) -> None:
        """Copy src into the segment starting at `offset`."""

    @abstractmethod
    def close(self, remove: bool = True) -> None:
        """Release the memory; with remove, also delete any backing file."""

    def _check_range(self, offset: int, length: int) -> None:
        if offset < 0 or length < 0 or offset + length > self.capacity:
            raise ValueError(f"range [{offset}, +{length}) outside segment {self.segment_id} of {self.capacity} bytes")


class DroppedBlock(NamedTuple):
    key: str
    reason: str


class RecoveryReport(NamedTuple):
    blocks: list[Block]  # journaled blocks whose bytes passed their checksum
    dropped: list[DroppedBlock]


# Capabilities some tiers have, stated so that callers ask by type (checked by mypy), not by
# probing attributes.


@runtime_checkable
class FileBacked(Protocol):
    """A segment whose bytes are a file that same-host clients may open (the `shm` transport)."""

    path: Path


@runtime_checkable
class Sendable(Protocol):
    """A segment the kernel can send from straight to a socket (sendfile), without a copy."""

    def sendfile(self, sock: socket.socket, offset: int, length: int, deadline: float | None = None) -> None:
        """Send [offset, +length) to `sock` by `deadline` (time.monotonic(); TimeoutError after
        it), OSError if the peer goes away."""


@runtime_checkable
class Persistent(Protocol):
    """A segment whose bytes outlive the daemon: kept on a clean stop, journaled (what lives where,
    and what the metadata service deleted), and recovered (checksum-verified) at the next start."""

    def record_many(self, records: Iterable[Block]) -> None:
        """Journal that each block's key lives at its range, once its bytes are durable."""

    def forget_many(self, blocks: Iterable[Block]) -> None:
        """Journal that each block (key, offset, checksum) lives here no more."""

    def recover(self) -> RecoveryReport:
        """The journaled blocks that are still intact."""


class Landing:
    """Where a write's payload lands: straight in segment memory for a segment with a view, else
    in a bounce buffer that finish() stores. `views[i]` receives the i-th target's bytes."""

    def __init__(self, targets: Iterable[tuple[SegmentStorage, int, int]]) -> None:
        self.views: list[memoryview] = []
        self._bounced: list[tuple[SegmentStorage, int, memoryview]] = []
        for segment, offset, length in targets:
            view = segment.view(offset, length)
            if view is None:
                view = memoryview(bytearray(length))
                self._bounced.append((segment, offset, view))
            self.views.append(view)

    def finish(self) -> None:
        """Store the bounced bytes (OSError or ValueError if the tier fails)."""
        for segment, offset, data in self._bounced:
            segment.write_from(offset, data)


def copy_between(src: SegmentStorage, src_offset: int, dst: SegmentStorage, dst_offset: int, size: int) -> None:
    """Copy `size` bytes between two segments of this daemon, through a bounce buffer only when
    neither has a view."""
    src_view = src.view(src_offset, size)
    if src_view is not None:
        dst.write_from(dst_offset, src_view)
        return
    dst_view = dst.view(dst_offset, size)
    if dst_view is not None:
        src.read_into(src_offset, dst_view)
        return
    bounce = memoryview(bytearray(size))
    src.read_into(src_offset, bounce)
    dst.write_from(dst_offset, bounce)
