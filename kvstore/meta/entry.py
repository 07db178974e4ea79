"""A COMPLETE object's record in the index (`Entry`), and how the index stores it: one int.

At millions of blocks the index's per-block memory, and the garbage collector's walk over it, are
what the metadata service pays for holding a block. As an object per block with an int per field,
a block cost 339-351 bytes with its key (`python -m kvstore.bench.metamem`, 300,000 and 1,000,000
blocks), and the collector tracked every such object: a full collection held the GIL 84-103 ms at
300,000 blocks and 260 ms at 1,000,000. So the index keeps each record as a single int of fixed
fields (bit 0 up):

    checksum (64) | size (48) | stamp (64) | replica count (8) | locations (64 each)

An int is not a container, so the collector never tracks one, and a dict that holds only str keys
and int values is never tracked either: full collections do not visit the index at all. A packed
record is one 64-byte int where the fields were an object and three ints (231-240 bytes a block
now; a full collection 18 ms at 300,000 blocks, 40 ms at 1,000,000, mostly the byte order's lists).
The index hands out `Entry` views, decoded on each read (~0.6 us): a view keeps the values it was
read with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kvstore.errors import InvalidArgument
from kvstore.meta.segments import OFFSET_BITS

_M64 = (1 << 64) - 1
_SIZE_SHIFT = 64
_M_SIZE = (1 << 48) - 1
_STAMP_SHIFT = 112
_STAMP_FIELD = _M64 << _STAMP_SHIFT
_COUNT_SHIFT = 176
_LOCATIONS_SHIFT = 184
MAX_REPLICAS = 255
MAX_SIZE = _M_SIZE
MAX_CHECKSUM = _M64


class Entry(NamedTuple):
    """A COMPLETE object. `locations` is one packed location, or a tuple of them for replicas;
    `stamp` its recency (greater: used more recently)."""

    locations: int | tuple[int, ...]
    size: int
    checksum: int
    stamp: int

    def replicas(self) -> tuple[int, ...]:
        loc = self.locations
        return (loc,) if isinstance(loc, int) else loc

    def segments(self) -> set[int]:
        """The numbers of the segments its replicas are in."""
        loc = self.locations
        return {loc >> OFFSET_BITS} if isinstance(loc, int) else segment_numbers(loc)


def segment_numbers(locations: tuple[int, ...]) -> set[int]:
    """The numbers of the segments of these locations."""
    return {loc >> OFFSET_BITS for loc in locations}


def check_checksums(checksums: Sequence[int]) -> None:
    """InvalidArgument unless every checksum is a 64-bit unsigned value (xxh3-64's range): asked
    before a call changes anything."""
    if checksums and not (min(checksums) >= 0 and max(checksums) <= _M64):
        raise InvalidArgument("a checksum is not a 64-bit unsigned value (xxh3-64): check the writer")


def encode(locations: int | tuple[int, ...], size: int, checksum: int, stamp: int) -> int:
    """The record as one int; InvalidArgument for a field that does not fit its width."""
    if not (0 <= checksum <= _M64 and 0 < size <= _M_SIZE and 0 <= stamp <= _M64):
        raise InvalidArgument(f"checksum {checksum}, size {size} or stamp {stamp} out of range for the index")
    head = checksum | size << _SIZE_SHIFT | stamp << _STAMP_SHIFT
    if isinstance(locations, int):
        if not 0 <= locations <= _M64:
            raise InvalidArgument(f"location {locations} out of range for the index")
        return head | 1 << _COUNT_SHIFT | locations << _LOCATIONS_SHIFT
    if not 0 < len(locations) <= MAX_REPLICAS or not all(0 <= loc <= _M64 for loc in locations):
        raise InvalidArgument(f"{len(locations)} replicas at {locations}: out of range for the index")
    packed = 0
    for loc in reversed(locations):
        packed = packed << 64 | loc
    return head | len(locations) << _COUNT_SHIFT | packed << _LOCATIONS_SHIFT


def decode(packed: int) -> Entry:
    count = packed >> _COUNT_SHIFT & 0xFF
    if count == 1:
        locations: int | tuple[int, ...] = packed >> _LOCATIONS_SHIFT
    else:
        rest = packed >> _LOCATIONS_SHIFT
        locations = tuple(rest >> (64 * i) & _M64 for i in range(count))
    return Entry(locations, packed >> _SIZE_SHIFT & _M_SIZE, packed & _M64, packed >> _STAMP_SHIFT & _M64)


def stamp_of(packed: int) -> int:
    return packed >> _STAMP_SHIFT & _M64


def restamped(packed: int, stamp: int) -> int:
    """The record with its stamp replaced."""
    return packed & ~_STAMP_FIELD | stamp << _STAMP_SHIFT


def single_location(packed: int) -> int | None:
    """The location of a record with one replica; None for one with several."""
    return packed >> _LOCATIONS_SHIFT if packed >> _COUNT_SHIFT & 0xFF == 1 else None
