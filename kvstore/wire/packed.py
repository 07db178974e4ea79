"""A Get's results without a protobuf message per key or per grant (`PackedGetResults`).

A batched first read of thousands of small blocks spent more time making and reading one
`GetResult` and one `Grant` message per key than the service spent finding the blocks. Here the
grants are fixed-size records in one bytes field, and the per-key numbers travel either as
packed repeated fields (COLUMNS) or as a fixed-size record per key (ROWS), each side looping once
in Python over plain values. Rows are what clients of this version ask for: one struct call per
key instead of five repeated fields to read, which a single-key Get (most calls) feels most.
Columns stay for clients that predate rows.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.results import GetResult, found
from kvstore.types import Grant, GrantMode, new_grant
from kvstore.v1 import meta_pb2 as pb

MESSAGES, COLUMNS, ROWS = 0, 1, 2  # GetRequest.packed: how the caller reads the results
_HEAD = "<IQQBQI"  # segment index, offset, length, mode, expires_ms, flags; then the MAC
_RECORDS: dict[int, struct.Struct] = {}
ROW = struct.Struct("<IIQQQ")  # code, replica count, size, checksum, lease id
_MODES = {int(m): m for m in GrantMode}
_OK = int(ErrorCode.OK)
OK_CODE = ErrorCode.OK


def _record(mac_bytes: int) -> struct.Struct:
    rec = _RECORDS.get(mac_bytes)
    if rec is None:
        rec = _RECORDS[mac_bytes] = struct.Struct(f"{_HEAD}{mac_bytes}s")
    return rec


def _grants(results: Sequence[GetResult]) -> tuple[list[str], bytes, int]:
    """The grant table: segment names, the records of every grant in key order, the MAC size."""
    mac_bytes = next((len(g.mac) for r in results for g in r.grants), 0)
    record = _record(mac_bytes).pack
    segments: dict[str, int] = {}
    grants = bytearray()
    for r in results:
        for g in r.grants:
            seg = segments.setdefault(g.segment_id, len(segments))
            grants += record(seg, g.offset, g.length, g.mode, g.expires_ms, g.flags, g.mac)
    return list(segments), bytes(grants), mac_bytes


def pack(results: Sequence[GetResult], layout: int = ROWS) -> pb.PackedGetResults:
    segments, grants, mac_bytes = _grants(results)
    if layout == ROWS:
        row = ROW.pack
        return pb.PackedGetResults(
            rows=b"".join([row(r.code, len(r.grants), r.size, r.checksum, r.lease_id) for r in results]),
            messages=[r.message for r in results if r.code is not OK_CODE],
            grant_segments=segments, grants=grants, mac_bytes=mac_bytes,
        )  # fmt: skip
    return pb.PackedGetResults(
        codes=[pb.ErrorCode.ValueType(r.code) for r in results], messages=[r.message for r in results],
        sizes=[r.size for r in results], checksums=[r.checksum for r in results],
        lease_ids=[r.lease_id for r in results], replica_counts=[len(r.grants) for r in results],
        grant_segments=segments, grants=grants, mac_bytes=mac_bytes,
    )  # fmt: skip


def is_rows(msg: pb.PackedGetResults) -> bool:
    """Whether `msg` holds rows (an empty Get reads the same either way)."""
    return bool(msg.rows)


def counts(msg: pb.PackedGetResults) -> tuple[list[int], list[int]]:
    """Each key's code and replica count, in either layout (for the service's metrics)."""
    if msg.rows:
        rows = list(ROW.iter_unpack(msg.rows))
        return [r[0] for r in rows], [r[1] for r in rows]
    return list(msg.codes), list(msg.replica_counts)


def unpack(msg: pb.PackedGetResults, known: frozenset[int]) -> tuple[GetResult, ...]:
    """The results; `known`: the error codes this version knows (others read as INTERNAL).
    InvalidArgument for a reply whose parts disagree (one no service of this version sends)."""
    try:
        if msg.rows:
            keys: Iterable[_Key] = ROW.iter_unpack(msg.rows)
            failures: Iterator[str] = iter(msg.messages)
        else:
            keys, failures = _columns(msg)
        return _results(keys, failures, msg, known)
    except struct.error:
        raise InvalidArgument("a packed Get reply whose rows or grants are cut short") from None
    except StopIteration:
        raise InvalidArgument("a packed Get reply whose grants do not match its replica counts") from None
    except (IndexError, KeyError) as exc:
        raise InvalidArgument(f"a packed Get reply names an unknown segment or grant mode: {exc}") from None


_Key = tuple[int, int, int, int, int]  # code, replica count, size, checksum, lease id


def _columns(msg: pb.PackedGetResults) -> tuple[Iterable[_Key], Iterator[str]]:
    """The columns as rows, and the messages of the failed keys."""
    codes = list(msg.codes)  # plain lists: indexing a protobuf container makes an object a time
    columns = (list(msg.replica_counts), list(msg.sizes), list(msg.checksums), list(msg.lease_ids))
    messages = list(msg.messages)
    if any(len(c) != len(codes) for c in (*columns, messages)):
        raise InvalidArgument("a packed Get reply whose columns differ in length")
    return zip(codes, *columns), (m for c, m in zip(codes, messages) if c != _OK)


def _results(
    keys: Iterable[_Key], failures: Iterator[str], msg: pb.PackedGetResults, known: frozenset[int]
) -> tuple[GetResult, ...]:
    record = _record(msg.mac_bytes)
    data = msg.grants
    if len(data) % record.size:
        raise struct.error("grants cut short")
    segments = list(msg.grant_segments)
    records = record.iter_unpack(data)
    modes = _MODES
    out: list[GetResult] = []
    for code, count, size, checksum, lease in keys:
        if code != _OK:
            message = next(failures, None)
            if message is None:
                raise InvalidArgument("a packed Get reply whose messages do not match its failed keys")
            out.append(GetResult(ErrorCode(code) if code in known else ErrorCode.INTERNAL, message))
            continue
        if count == 1:  # the common case: one replica
            grants: tuple[Grant, ...] = (_grant(segments, modes, *next(records)),)
        else:  # a list, not a generator: running out of records raises StopIteration as it is
            grants = tuple([_grant(segments, modes, *next(records)) for _ in range(count)])
        out.append(found(size, checksum, grants, lease))
    if next(records, None) is not None:
        raise InvalidArgument("a packed Get reply whose grants do not match its replica counts")
    if next(failures, None) is not None:
        raise InvalidArgument("a packed Get reply whose messages do not match its failed keys")
    return tuple(out)


def _grant(
    segments: list[str], modes: dict[int, GrantMode], seg: int, offset: int, length: int, mode: int, expires: int,
    flags: int, mac: bytes,
) -> Grant:  # fmt: skip
    return new_grant(segments[seg], offset, length, modes[mode], expires, mac, flags)
