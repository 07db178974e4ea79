"""A Get's results travel as columns (kvstore.wire.packed): every field of every result, error and
grant comes back as it went, a reply an older service sends (a message per key) still reads, and
a malformed packed reply is refused with InvalidArgument, never read as someone else's grants."""

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


@pytest.mark.parametrize("columns", [True, False])
def test_every_field_comes_back(columns):
    reply = GetReply(RESULTS, {}, 5000, packed=columns)
    msg = pb.GetResponse.FromString(convert.get_reply_to_pb(reply).SerializeToString())
    assert msg.HasField("packed") is columns and bool(msg.results) is not columns
    assert convert.get_reply_from_pb(msg) == reply


def test_an_empty_get_and_all_errors():
    for results in ((), (GetResult(ErrorCode.KEY_NOT_FOUND, "gone"),) * 3):
        reply = GetReply(results, {}, 1, packed=True)
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


def test_an_unknown_error_code_reads_as_internal():
    msg = packed.pack((GetResult(ErrorCode.KEY_BUSY, "x"),))
    assert packed.unpack(msg, frozenset({0})) == (GetResult(ErrorCode.INTERNAL, "x"),)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda m: m.sizes.append(1),  # a column longer than the others
        lambda m: setattr(m, "grants", m.grants[:-1]),  # records cut short
        lambda m: m.replica_counts.__setitem__(0, 2),  # counts that do not match the records
        lambda m: m.grant_segments.pop(),  # a record naming a segment the table lacks
    ],
)
def test_a_malformed_reply_is_refused(spoil):
    msg = packed.pack(RESULTS)
    spoil(msg)
    with pytest.raises(InvalidArgument, match="packed Get reply"):
        packed.unpack(msg, frozenset(int(c) for c in ErrorCode))


def test_an_unknown_grant_mode_is_refused():
    msg = packed.pack(RESULTS[:1])
    record = bytearray(msg.grants)
    record[4 + 8 + 8] = 9  # the mode byte
    msg.grants = bytes(record)
    with pytest.raises(InvalidArgument, match="grant mode"):
        packed.unpack(msg, frozenset(int(c) for c in ErrorCode))
