"""The tier interface: the bytes behind one segment on a daemon.

A segment is a fixed-size region the metadata service allocates blocks in; the daemon only stores
and moves bytes at offsets it is told (under a grant). Transports use `view()` when a tier is
memory backed (zero copy: recv_into / sendall straight from it) and `read_into` / `write_from`
otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from kvstore.types import Tier


class SegmentStorage(ABC):
    segment_id: str
    tier: Tier
    capacity: int
    persistent: bool = False      # its bytes outlive the daemon (kept on clean shutdown)

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
            raise ValueError(f"range [{offset}, +{length}) outside segment {self.segment_id} "
                             f"of {self.capacity} bytes")
