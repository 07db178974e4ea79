"""The metadata fast lane: same answers as gRPC, bad frames refused, gRPC as the fallback."""

import socket
import struct

import pytest

from kvstore import fastrpc
from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, KeyNotFound
from kvstore.v1 import meta_pb2 as pb


@pytest.fixture(scope="module")
def served():
    from tests.cluster import Cluster

    c = Cluster()
    _, address = c.serve("64MiB")
    yield address
    c.close()


def lane_port(address: str) -> int:
    with KVClient(address) as c:
        return c._rpc("ServiceInfo", pb.ServiceInfoRequest()).fast_lane_port


def test_both_lanes_give_the_same_answers(served):
    keys = [f"lane/{i}" for i in range(50)]
    with KVClient(served, ClientConfig(fast_lane=True)) as fast, \
            KVClient(served, ClientConfig(fast_lane=False)) as slow:
        fast.put_many(keys[:25], [bytes([i]) * 100 for i in range(25)])
        slow.put_many(keys[25:], [bytes([i]) * 100 for i in range(25, 50)])
        for c in (fast, slow):
            assert c.match_prefix(keys) == 50
            assert c.get_many(keys) == [bytes([i]) * 100 for i in range(50)]
            with pytest.raises(KeyNotFound):
                c.get("lane/missing")
            with pytest.raises(InvalidArgument):
                c._rpc("PutStart", pb.PutStartRequest(keys=["x"], sizes=[]))
        assert fast._meta._lane_port and not slow._meta._lane_port


@pytest.mark.parametrize("frame", [
    b"garbage!",
    fastrpc.REQUEST.pack(10, 999) + bytes(10),                  # no such method
    fastrpc.REQUEST.pack(1 << 31, 0),                           # absurd length
    fastrpc.REQUEST.pack(5, fastrpc.BY_NAME["Get"].index) + b"\xff" * 5,   # not a GetRequest
])
def test_bad_frames_are_refused_and_the_lane_keeps_serving(served, frame):
    host, _ = served.rsplit(":", 1)
    with socket.create_connection((host, lane_port(served)), timeout=5) as s:
        s.sendall(frame)
        try:
            header = s.recv(fastrpc.RESPONSE.size, socket.MSG_WAITALL)
            if header:
                _, status = fastrpc.RESPONSE.unpack(header)
                assert status != fastrpc.OK
        except (ConnectionResetError, struct.error):
            pass
    with KVClient(served) as c:
        assert c.exists("lane/never") is False


def test_unreachable_lane_falls_back_to_grpc(served):
    with KVClient(served) as c:
        c._meta._lane_port = 1                   # nothing listens there
        assert c.exists("lane/never") is False
        assert c._meta._lane_down_until > 0
