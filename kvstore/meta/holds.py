"""Space held outside every stored object, kept durable so that a successor never hands out a range
an old grant can still reach.

The records of stored objects tell a service taking over which space is used; they do not tell
it which space its predecessor had placed but not yet filled (a put in progress, a region, a
move's destination) or had freed while a grant or a reader could still touch it (quarantine.py).
Each such range is a hold, journaled with the change that made it, before any grant over it is
answered: the successor reserves every hold's range that no object took, and hands it out only
once every grant its predecessor may have signed has expired (gate.py). The rest of the store is
writable at once.

A hold starts when space is placed, ends when a stored object owns exactly that range, starts
again when an object lets go of it, and ends for good when the space is freed. A region is held
whole, under a record of its own, until it ends (its gaps are freed then; its values are owned
by objects, and held again when they let go).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

from kvstore.errors import InvalidArgument

_SIZE = struct.Struct("<Q")


class HoldRecord(NamedTuple):
    location: int
    size: int
    region: bool


class Holds:
    def __init__(self) -> None:
        self._size: dict[int, int] = {}  # location -> bytes held there
        self._regions: dict[int, int] = {}  # location -> bytes of a region starting there
        self.changed: set[int] = set()  # locations whose hold started or ended since the last take
        self._changed_regions: set[int] = set()

    def __len__(self) -> int:
        return len(self._size) + len(self._regions)

    def __contains__(self, location: int) -> bool:
        return location in self._size

    def items(self) -> list[tuple[int, int]]:
        """(location, size) of every hold, regions included."""
        return [*self._size.items(), *self._regions.items()]

    def region(self, location: int, size: int) -> None:
        self._regions[location] = size
        self._changed_regions.add(location)

    def region_ended(self, location: int) -> None:
        if self._regions.pop(location, None) is not None:
            self._changed_regions.add(location)

    def replaced(self, record: HoldRecord) -> None:
        """A predecessor's record, now kept as holds of its own: it goes unless held again."""
        (self._changed_regions if record.region else self.changed).add(record.location)

    def hold(self, location: int, size: int) -> None:
        """Space at `location` is placed, or let go of by its object: held until owned or freed."""
        if self._size.get(location) != size:
            self._size[location] = size
            self.changed.add(location)

    def owned(self, location: int, size: int) -> None:
        """A stored object of `size` bytes owns `location` now (a region's values, smaller than
        their region, leave the region held)."""
        if self._size.get(location) == size:
            del self._size[location]
            self.changed.add(location)

    def ended(self, location: int) -> None:
        """The space at `location` is free again (or a region ended)."""
        if self._size.pop(location, None) is not None:
            self.changed.add(location)

    def forget(self, in_segment: Callable[[int], bool]) -> None:
        """A segment went away, and its space with it."""
        for location in [loc for loc in self._size if in_segment(loc)]:
            self.ended(location)
        for location in [loc for loc in self._regions if in_segment(loc)]:
            self.region_ended(location)

    def take_changes(self) -> dict[str, bytes | None]:
        """The records of every hold that started or ended since the last call (None: ended)."""
        out: dict[str, bytes | None] = {}
        for prefix, table, changed in (("", self._size, self.changed), ("r", self._regions, self._changed_regions)):
            for location in changed:
                size = table.get(location)
                out[prefix + format(location, "x")] = None if size is None else _SIZE.pack(size)
        self.changed, self._changed_regions = set(), set()
        return out


def decode_hold(field: bytes, value: bytes) -> HoldRecord:
    """A hold record (a region's field is prefixed "r")."""
    if len(value) != _SIZE.size:
        raise InvalidArgument(f"a hold record of {len(value)} bytes is not of this schema")
    (size,) = _SIZE.unpack(value)
    region = field.startswith(b"r")
    return HoldRecord(int(field.removeprefix(b"r"), 16), size, region)
