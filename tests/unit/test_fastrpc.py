"""The fast lane's method ids are pinned: a new RPC takes a new id, none is ever renumbered."""

from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import frames

# The ids as released. Append new RPCs here with new ids; never change or reuse a line.
RELEASED = {
    "MountSegment": 1, "UnmountSegment": 2, "Heartbeat": 3, "PutStart": 4, "PutEnd": 5, "PutRevoke": 6,
    "Get": 7, "Exists": 8, "MatchPrefix": 9, "Remove": 10, "Pin": 11, "Unpin": 12, "ClaimMoves": 13,
    "CompleteMoves": 14, "AnnounceBlocks": 15, "Stats": 16, "ServiceInfo": 17,
    "ListKeys": 18, "Describe": 19, "TenantAdd": 20, "TenantToken": 21, "TenantRevoke": 22, "TenantList": 23,
    "Reserve": 24, "PutCommit": 25,
}  # fmt: skip


def test_released_ids_never_change():
    for name, method_id in RELEASED.items():
        assert frames.METHOD_IDS.get(name) == method_id, f"{name} was renumbered"


def test_every_rpc_has_a_unique_id_and_none_is_the_hello():
    service = pb.DESCRIPTOR.services_by_name["MetaService"]
    assert {m.name for m in service.methods} == set(frames.METHOD_IDS)
    ids = list(frames.METHOD_IDS.values())
    assert len(set(ids)) == len(ids) and frames.HELLO not in ids


def test_methods_carry_the_service_messages():
    get = frames.BY_NAME["Get"]
    assert (get.id, get.request, get.response) == (7, pb.GetRequest, pb.GetResponse)
