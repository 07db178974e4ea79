"""A Get's results as columns (`PackedGetResults`): no protobuf message per key or per grant.

A batched first read of thousands of small blocks spent more time making and reading one
`GetResult` and one `Grant` message per key than the service spent finding the blocks. Here the
per-key numbers travel as packed repeated fields and the grants as fixed-size records in one
bytes field, each side looping once in Python over plain values.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.results import GetResult
from kvstore.types import Grant, GrantMode
from kvstore.v1 import meta_pb2 as pb

_HEAD = "<IQQBQI"  # segment index, offset, length, mode, expires_ms, flags; then the MAC
_RECORDS: dict[int, struct.Struct] = {}
_MODES = {int(m): m for m in GrantMode}
_OK = int(ErrorCode.OK)
OK_CODE = ErrorCode.OK


def _record(mac_bytes: int) -> struct.Struct:
    rec = _RECORDS.get(mac_bytes)
    if rec is None:
        rec = _RECORDS[mac_bytes] = struct.Struct(f"{_HEAD}{mac_bytes}s")
    return rec


def pack(results: Sequence[GetResult]) -> pb.PackedGetResults:
    mac_bytes = next((len(g.mac) for r in results for g in r.grants), 0)
    record = _record(mac_bytes).pack
    segments: dict[str, int] = {}
    grants = bytearray()
    codes: list[pb.ErrorCode.ValueType] = []
    messages, sizes, checksums, leases, counts = [], [], [], [], []
    for r in results:
        codes.append(pb.ErrorCode.ValueType(r.code))
        messages.append(r.message)
        sizes.append(r.size)
        checksums.append(r.checksum)
        leases.append(r.lease_id)
        counts.append(len(r.grants))
        for g in r.grants:
            seg = segments.setdefault(g.segment_id, len(segments))
            grants += record(seg, g.offset, g.length, g.mode, g.expires_ms, g.flags, g.mac)
    return pb.PackedGetResults(
        codes=codes, messages=messages, sizes=sizes, checksums=checksums, lease_ids=leases,
        replica_counts=counts, grant_segments=list(segments), grants=bytes(grants), mac_bytes=mac_bytes,
    )  # fmt: skip


def unpack(msg: pb.PackedGetResults, known: frozenset[int]) -> tuple[GetResult, ...]:
    """The results; `known`: the error codes this version knows (others read as INTERNAL).
    InvalidArgument if the columns disagree (a reply no service of this version sends)."""
    codes = list(msg.codes)  # plain lists: indexing a protobuf container makes an object a time
    columns = (list(msg.messages), list(msg.sizes), list(msg.checksums), list(msg.lease_ids), list(msg.replica_counts))
    if any(len(c) != len(codes) for c in columns):
        raise InvalidArgument("a packed Get reply whose columns differ in length")
    record = _record(msg.mac_bytes)
    data = msg.grants
    if len(data) != sum(columns[-1]) * record.size:
        raise InvalidArgument("a packed Get reply whose grants do not match its replica counts")
    segments = list(msg.grant_segments)
    records = record.iter_unpack(data)
    modes = _MODES
    out: list[GetResult] = []
    try:
        for code, message, size, checksum, lease, count in zip(codes, *columns):
            if code != _OK:
                out.append(GetResult(ErrorCode(code) if code in known else ErrorCode.INTERNAL, message))
                continue
            if count == 1:  # the common case: one replica
                s, off, length, mode, expires, flags, mac = next(records)
                grants: tuple[Grant, ...] = (Grant(segments[s], off, length, modes[mode], expires, mac, flags),)
            else:
                grants = tuple(
                    Grant(segments[s], off, length, modes[mode], expires, mac, flags)
                    for s, off, length, mode, expires, flags, mac in (next(records) for _ in range(count))
                )
            out.append(GetResult(OK_CODE, "", size, checksum, grants, lease))
    except (IndexError, KeyError) as exc:
        raise InvalidArgument(f"a packed Get reply names an unknown segment or grant mode: {exc}") from None
    return tuple(out)
