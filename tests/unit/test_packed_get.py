"""A Get's results travel as rows or columns (kvstore.wire.packed): every field of every result,
error and grant comes back as it went in each layout, a reply an older service sends (columns, or
a message per key) still reads, and a malformed packed reply is refused with InvalidArgument, never
read as someone else's grants."""

from __future__ import annotations

import pytest

from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.results import GetReply, GetResult
from kvstore.types import Grant, GrantMode
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import convert, packed


def _grant(seg: str, offset: int, flags: int = 0) -> Grant:
    return Grant(seg, offset, 4096, GrantMode.READ, 1_700_000_000_123, bytes(range(16)), flags)


RESULTS = (
    GetResult(size=4096, checksum=2**64 - 1, grants=(_grant("seg-a", 0, 1),), lease_id=7),
    GetResult(ErrorCode.KEY_NOT_FOUND, "'k1' is not stored"),
    GetResult(size=10, checksum=3, grants=(_grant("seg-b", 2**40), _grant("seg-a", 8192)), lease_id=2**63),
    GetResult(ErrorCode.KEY_BUSY, "'k3' is still being written"),
    GetResult(size=1, checksum=0, grants=(_grant("seg-c", 4096, 3),), lease_id=0),
)


LAYOUTS = [packed.MESSAGES, packed.COLUMNS, packed.ROWS]
KNOWN = frozenset(int(c) for c in ErrorCode)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_field_comes_back(layout):
    reply = GetReply(RESULTS, {}, 5000, packed=layout)
    msg = pb.GetResponse.FromString(convert.get_reply_to_pb(reply).SerializeToString())
    assert msg.HasField("packed") is bool(layout) and bool(msg.results) is not bool(layout)
    assert packed.is_rows(msg.packed) is (layout == packed.ROWS)
    back = convert.get_reply_from_pb(msg)
    assert back == reply and back.packed == layout


def test_rows_carry_a_message_only_for_each_failed_key():
    msg = packed.pack(RESULTS, packed.ROWS)
    assert list(msg.messages) == ["'k1' is not stored", "'k3' is still being written"]
    assert not msg.codes and not msg.sizes and len(msg.rows) == len(RESULTS) * packed.ROW.size


@pytest.mark.parametrize("layout", [packed.COLUMNS, packed.ROWS])
def test_an_empty_get_and_all_errors(layout):
    for results in ((), (GetResult(ErrorCode.KEY_NOT_FOUND, "gone"),) * 3):
        reply = GetReply(results, {}, 1, packed=layout)
        assert convert.get_reply_from_pb(convert.get_reply_to_pb(reply)).results == results


def test_a_reply_with_a_message_per_key_still_reads():
    old = pb.GetResponse(
        results=[
            pb.GetResult(size=5, checksum=9, replicas=[convert.grant_to_pb(_grant("s", 0))], lease_id=4),
            pb.GetResult(status=pb.Status(code=pb.KEY_NOT_FOUND, message="no")),
        ],
        lease_ms=3,
    )
    assert convert.get_reply_from_pb(old).results == (
        GetResult(size=5, checksum=9, grants=(_grant("s", 0),), lease_id=4),
        GetResult(ErrorCode.KEY_NOT_FOUND, "no"),
    )


@pytest.mark.parametrize("layout", [packed.COLUMNS, packed.ROWS])
def test_an_unknown_error_code_reads_as_internal(layout):
    msg = packed.pack((GetResult(ErrorCode.KEY_BUSY, "x"),), layout)
    assert packed.unpack(msg, frozenset({0})) == (GetResult(ErrorCode.INTERNAL, "x"),)


def _row_count(m: pb.PackedGetResults, i: int, count: int) -> None:
    rows = bytearray(m.rows)
    rows[i * packed.ROW.size + 4 : i * packed.ROW.size + 8] = count.to_bytes(4, "little")
    m.rows = bytes(rows)


def _spoiled(layout: int, spoil) -> pb.PackedGetResults:
    msg = packed.pack(RESULTS, layout)
    spoil(msg)
    return msg


@pytest.mark.parametrize(
    "layout, spoil",
    [
        (packed.COLUMNS, lambda m: m.sizes.append(1)),  # a column longer than the others
        (packed.COLUMNS, lambda m: m.replica_counts.__setitem__(0, 2)),  # counts that do not match the records
        (packed.ROWS, lambda m: setattr(m, "rows", m.rows[:-1])),  # a row cut short
        (packed.ROWS, lambda m: _row_count(m, 0, 2)),  # more replicas than records
        (packed.ROWS, lambda m: _row_count(m, 2, 1)),  # fewer: records left over
        (packed.ROWS, lambda m: m.messages.pop()),  # a failed row without its message
        (packed.ROWS, lambda m: m.messages.append("spare")),  # a message without a failed row
        *[(layout, lambda m: setattr(m, "grants", m.grants[:-1])) for layout in (packed.COLUMNS, packed.ROWS)],
        *[(layout, lambda m: m.grant_segments.pop()) for layout in (packed.COLUMNS, packed.ROWS)],
    ],
)
def test_a_malformed_reply_is_refused(layout, spoil):
    with pytest.raises(InvalidArgument, match="packed Get reply"):
        packed.unpack(_spoiled(layout, spoil), KNOWN)


@pytest.mark.parametrize("layout", [packed.COLUMNS, packed.ROWS])
def test_an_unknown_grant_mode_is_refused(layout):
    msg = packed.pack(RESULTS[:1], layout)
    record = bytearray(msg.grants)
    record[4 + 8 + 8] = 9  # the mode byte
    msg.grants = bytes(record)
    with pytest.raises(InvalidArgument, match="grant mode"):
        packed.unpack(msg, KNOWN)


def test_the_layout_field_reads_on_the_wire_as_the_bool_it_was():
    """`packed` was a bool: a service that predates rows decodes 2 as true (columns), and an
    older client's true reads here as 1 (columns)."""
    two = pb.GetRequest(packed=packed.ROWS).SerializeToString()
    assert two == b"\x38\x02"  # field 7, varint: what a bool field decodes as true
    assert pb.GetRequest.FromString(b"\x38\x01").packed == packed.COLUMNS
