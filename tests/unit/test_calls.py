"""Each metadata call said once (kvstore/wire/calls.py): one value class per RPC of the proto, whose
fields travel as the request message's, and whose reply comes back as the client's value, the
same through every MetaApi: a store's handlers in process (LocalMeta), a service over the wire
(MetaClient) and a store split over two shards (ShardedMetaClient)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvstore.errors import ErrorCode, InvalidArgument, KeyNotFound, PermissionDenied
from kvstore.metaclient.client import MetaClient
from kvstore.metaclient.sharded import client_for
from kvstore.results import (
    OK,
    Block,
    HeartbeatReply,
    KeyResult,
    MoveOutcome,
    PutEndReply,
    PutWritten,
    ServiceInfoReply,
    StoreStats,
    TenantInfo,
)
from kvstore.server.auth import ADMIN, ANYONE, DAEMON, DATA, Principal
from kvstore.server.local import LocalMeta
from kvstore.shards import ShardMap
from kvstore.types import Endpoint, SegmentInfo, Tier
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import calls, codec, frames
from kvstore.wire.call import Call, Fan
from kvstore.wire.calls import (
    CALLS,
    CompleteMoves,
    Describe,
    Exists,
    Get,
    ListKeys,
    MatchPrefix,
    Pin,
    PutEnd,
    PutStart,
    Remove,
    Reserve,
    ServiceInfo,
    Stats,
    TenantAdd,
    TenantList,
    TenantToken,
    Unpin,
)
from tests.inprocess import InProcessStore

SEGMENT = SegmentInfo("s1", "d1", Tier.DRAM, 1 << 20, (Endpoint("tcp", "127.0.0.1:1"),), "h")


def test_every_rpc_of_the_proto_is_one_call_class():
    rpcs = {m.name for m in pb.DESCRIPTOR.services_by_name["MetaService"].methods}
    assert set(CALLS) == rpcs
    assert len({c.method_id for c in CALLS.values()}) == len(CALLS)  # ids never shared
    assert {name: cls.method_id for name, cls in CALLS.items()} == frames.METHOD_IDS
    assert rpcs == DATA | DAEMON | ADMIN | ANYONE and len(DATA) + len(DAEMON) + len(ADMIN) + len(ANYONE) == len(rpcs)
    for cls in CALLS.values():  # a keyed call's keyed fields are its own
        assert set(cls.keyed) <= {f.name for f in dataclasses.fields(cls)}, cls.rpc
        assert cls.fan is not Fan.SPLIT or "keys" in cls.keyed or cls.leases, cls.rpc  # keys, or leases alone


SAMPLES: list[Call[Any]] = [
    PutStart(["a", "b"], [1, 2], 2, "host"),
    PutEnd(["a"], [7], [PutWritten(1, (b"r", b""))], ["s9"]),
    Get(["a"], [3, 4], "h", "c", ["s1"], ["t"]),
    Remove(["a"], True, [5], "c"),
    Pin(["a"], 1.5),
    Unpin(["a"]),
    Exists(["a"]),
    MatchPrefix(["a", "b"]),
    Reserve("c", "h", 4096),
    ListKeys("p", 10, "cur"),
    Describe(["a"]),
    calls.MountSegment(SEGMENT),
    calls.Heartbeat("d1", ["s1"]),
    calls.ClaimMoves("d1", 100),
    CompleteMoves("d1", [MoveOutcome(3, False, "gone")]),
    calls.AnnounceBlocks("s1", [Block("k", 0, 10, 99)]),
    TenantAdd(TenantInfo("t", 3, {Tier.DRAM: 10}, {}, True, False, False), True, True),
    TenantToken("t", 2.0, "tok"),
    calls.TenantRevoke("t", "id"),
    TenantList(),
    Stats(),
    ServiceInfo(),
    calls.UnmountSegment("s1"),
    calls.PutRevoke(["a"], ["s1"]),
    calls.PutCommit("c", 1, ["a"], [0], [3], [9], [2]),
    calls.Release([1, 2], "c"),
]


def _plain(value: object) -> object:
    """Sequences as lists: a value decoded from the wire holds lists where the caller gave tuples."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return [_plain(v) for v in value]
    return value


def test_the_samples_cover_every_call():
    assert {s.rpc for s in SAMPLES} == set(CALLS)


@pytest.mark.parametrize("req", SAMPLES, ids=lambda r: type(r).rpc)
def test_a_call_comes_back_from_its_message_as_it_was_sent(req):
    msg = codec.request_to_pb(req)
    assert type(msg).__name__ == f"{type(req).rpc}Request"
    again = codec.request_from_pb(type(req), type(msg).FromString(msg.SerializeToString()))
    assert _plain(again) == _plain(req)


def test_fields_that_differ_on_the_wire_say_so():
    def sent(req: Call[Any]) -> Any:
        return codec.request_to_pb(req)

    assert sent(Pin(["a"], 1.5)).ttl_ms == 1500
    assert sent(TenantToken("t", 0.25)).ttl_ms == 250
    assert sent(Reserve("c", "h", 4096)).bytes == 4096
    assert [r.move_id for r in sent(CompleteMoves("d", [MoveOutcome(3, True)])).results] == [3]


STATS = StoreStats(1, 2, 3, 4, 5, 6, 7, 8, role="leader", epoch=3, leader="a:1", standbys=("b:2",), redis="ok",
                   reconciling=1, writes_open=False, tenant="t", shard=1, shards=2)  # fmt: skip
KEY_RESULTS = [KeyResult(ErrorCode.ALREADY_EXISTS, "x" * 300), OK, KeyResult(ErrorCode.KEY_BUSY)]
REPLIES: list[tuple[Call[Any], Any]] = [
    (Stats(), STATS),
    (ServiceInfo(), ServiceInfoReply("1.0", 7, "leader", 3, "a:1", 1, ShardMap(("a:1", "b:2"), 4))),
    (calls.Heartbeat("d", []), HeartbeatReply(("s1",), 500)),
    (TenantToken("t"), ("id", "token")),
    (Exists(["a", "b"]), [True, False]),
    (MatchPrefix(["a"]), 3),
    (calls.UnmountSegment("s"), 2),
    (calls.MountSegment(SEGMENT), None),
    (calls.PutCommit("c", 1, ["a", "b", "c"], [0, 64, 128], [1, 1, 1], [1, 2, 3]), KEY_RESULTS),
    (calls.PutRevoke(["a", "b", "c"]), KEY_RESULTS),
    (
        calls.PutEnd(["a", "b", "c"], [1, 2, 3], [PutWritten(1, (b"r",))] * 3),
        PutEndReply(tuple(KEY_RESULTS), (1, 0, 2)),
    ),
]


def test_key_results_are_encoded_as_protobuf_encodes_them():
    """A reply's per-key results are encoded without a Status message per key (call.One.encode):
    byte for byte what protobuf makes of the messages, a message of 300 characters included (its
    length takes two bytes)."""
    req = calls.PutCommit("c", 1, ["a", "b", "c"], [0, 64, 128], [1, 1, 1], [1, 2, 3])
    msg = req.reply.to_pb(KEY_RESULTS, pb.PutCommitResponse)
    statuses = [pb.Status(code=pb.ALREADY_EXISTS, message="x" * 300), pb.Status(), pb.Status(code=pb.KEY_BUSY)]
    assert msg.SerializeToString() == pb.PutCommitResponse(results=statuses).SerializeToString()


@pytest.mark.parametrize(("req", "reply"), REPLIES, ids=lambda r: getattr(r, "rpc", ""))
def test_a_reply_comes_back_as_it_was_answered(req, reply):
    msg = req.reply.to_pb(reply, codec.response_type(type(req)))
    assert req.reply.from_pb(type(msg).FromString(msg.SerializeToString()), req) == reply


def test_a_message_field_left_out_is_refused_by_name():
    with pytest.raises(InvalidArgument, match="MountSegment needs a segment"):
        codec.request_from_pb(calls.MountSegment, pb.MountSegmentRequest())


def test_only_the_calls_safe_to_repeat_are_repeated():
    assert not PutStart(["a"], [1]).is_repeatable() and not TenantToken("t").is_repeatable()
    assert Get(["a"]).is_repeatable() and TenantAdd(TenantInfo("t"), update=True).is_repeatable()
    assert not TenantAdd(TenantInfo("t")).is_repeatable()  # a second add of a tenant is AlreadyExists


# -- one suite, three MetaApis ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store():
    with InProcessStore(dram_size=16 << 20, segment_size=16 << 20) as s:
        yield s


@pytest.fixture(scope="module")
def sharded():
    """Two shards of one store (static map); the daemon of shard 0 offers both a slice."""
    with InProcessStore({"KVSTORE_META_SHARD": "1/2"}, dram_size=8 << 20) as second:
        env = {"KVSTORE_META_SHARD": "0/2", "KVSTORE_META_SHARD_MAP": f",{second.address}"}
        with InProcessStore(env, dram_size=8 << 20) as first:
            yield first


@pytest.fixture(params=["local", "remote", "sharded"])
def api(request, store, sharded):
    if request.param == "local":
        yield LocalMeta(store.meta.handlers)
        return
    base = MetaClient(sharded.address if request.param == "sharded" else store.address)
    with client_for(base) as meta:
        yield meta


def test_a_put_a_get_and_a_remove_through_every_api(api, request):
    keys = [f"calls/{request.node.callspec.id}/{i}" for i in range(8)]
    started = api.call(PutStart(keys, [64] * len(keys)))
    assert [r.error() for r in started.results] == [None] * len(keys)
    assert all(r.grants and r.grants[0].segment_id in started.segments for r in started.results)
    ended = api.call(PutEnd(keys, [0] * len(keys), failed_segments=()))
    assert [r.error() for r in ended.results] == [None] * len(keys)
    assert api.call(Exists([*keys, "calls/absent"])) == [True] * len(keys) + [False]
    assert api.call(MatchPrefix([*keys[:3], "calls/absent", keys[3]])) == 3
    got = api.begin(Get(keys))()
    assert [r.error() for r in got.results] == [None] * len(keys)
    assert [i.key for i in api.call(Describe(keys[:2]))] == keys[:2]
    stats = api.call(Stats())
    assert stats.keys >= len(keys)
    assert stats.shards == (2 if request.node.callspec.id == "sharded" else 1)
    leases = [r.lease_id for r in got.results]
    removed = api.call(Remove(keys, released=leases))
    assert [r.error() for r in removed] == [None] * len(keys)
    assert api.call(Exists(keys)) == [False] * len(keys)
    assert isinstance(api.call(Remove(["calls/absent"]))[0].error(), KeyNotFound)


def test_release_hands_read_leases_back_to_the_shards_that_granted_them(api, request):
    keys = [f"release/{request.node.callspec.id}/{i}" for i in range(6)]
    api.call(PutStart(keys, [64] * len(keys)))
    api.call(PutEnd(keys, [0] * len(keys)))
    got = api.call(Get(keys, client_id="reader"))
    assert all(info.lease_s > 0 for info in api.call(Describe(keys)))
    assert api.call(calls.Release([r.lease_id for r in got.results], "reader")) is None
    assert [info.lease_s for info in api.call(Describe(keys))] == [0.0] * len(keys)


def test_a_caller_without_the_role_is_refused_through_the_local_api(store):
    tenant = LocalMeta(store.meta.handlers, Principal(7, "seven"))
    with pytest.raises(PermissionDenied):
        tenant.call(TenantList())
    with pytest.raises(PermissionDenied):
        tenant.call(calls.Heartbeat("d", []))
