"""How the metadata a journal keeps is encoded: a stored object, a mounted segment, a pin.

An object's record holds its size, checksum, the replicas it was put with, and its replicas as
packed locations (segment number << 44 | offset): segment numbers are persistent, kept in each
segment's record, so a service that loads the records rebuilds the same locations.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from kvstore.errors import InvalidArgument
from kvstore.meta.entry import MAX_REPLICAS, MAX_SIZE
from kvstore.types import SegmentInfo
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import convert

_OBJECT = struct.Struct("<QQB")  # size, checksum, replicas wanted; then one <Q per replica
_LOCATION = struct.Struct("<Q")
_SEGMENT = struct.Struct("<I")  # segment number; then the Segment message


class ObjectRecord(NamedTuple):
    size: int
    checksum: int
    wanted: int
    locations: tuple[int, ...]


class SegmentRecord(NamedTuple):
    number: int
    info: SegmentInfo


class Unreadable(NamedTuple):
    """A record a load could not decode, in place of the record: a restore skips it, logs it and
    counts it (one bad record must not keep every service from leading)."""

    table: str  # "obj", "seg", "pin", "ten" or "hold"
    key: str  # the record's field, undecodable bytes escaped
    why: str


def encode_object(record: ObjectRecord) -> bytes:
    head = _OBJECT.pack(record.size, record.checksum, min(record.wanted, 255))
    return head + b"".join(_LOCATION.pack(loc) for loc in record.locations)


def decode_object(data: bytes) -> ObjectRecord:
    if len(data) < _OBJECT.size or (len(data) - _OBJECT.size) % _LOCATION.size:
        raise InvalidArgument(f"an object record of {len(data)} bytes is not of this schema")
    size, checksum, wanted = _OBJECT.unpack_from(data)
    locations = tuple(loc for (loc,) in _LOCATION.iter_unpack(data[_OBJECT.size :]))
    if not 0 < size <= MAX_SIZE or len(locations) > MAX_REPLICAS:  # what no index entry can hold
        raise InvalidArgument(f"an object record of {size} bytes in {len(locations)} places is not a block")
    return ObjectRecord(size, checksum, wanted, locations)


def encode_segment(record: SegmentRecord) -> bytes:
    return _SEGMENT.pack(record.number) + convert.segment_to_pb(record.info).SerializeToString()


def decode_segment(data: bytes) -> SegmentRecord:
    if len(data) < _SEGMENT.size:
        raise InvalidArgument(f"a segment record of {len(data)} bytes is not of this schema")
    (number,) = _SEGMENT.unpack_from(data)
    return SegmentRecord(number, convert.segment_from_pb(pb.Segment.FromString(data[_SEGMENT.size :])))


def encode_pin(until: float) -> bytes:
    return repr(until).encode()


def decode_pin(data: bytes) -> float:
    return float(data)
