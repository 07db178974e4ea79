"""Idle and oversized frames, too many connections and giant batches: memory per connection
grows with what arrived, connections past the caps get a typed refusal, and other callers are
served throughout."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument
from kvstore.metaclient.client import MetaClient
from kvstore.transport import tcp_wire
from kvstore.types import MAX_BATCH_KEYS
from kvstore.wire import frames as fastrpc
from kvstore.wire.calls import ServiceInfo
from tests.cluster import ADMIN_TOKEN, wait_until
from tests.faults.conftest import rss_kib
from tests.meta_helpers import endpoint_address


@pytest.fixture
def served(faults):
    proc, meta = faults.serve("256MiB", "--segment-size", "64MiB")
    return proc, meta


def test_frames_announcing_64_mib_cost_the_fast_lane_nothing_until_they_arrive(served):
    proc, meta = served
    port = MetaClient(meta).call(ServiceInfo()).fast_lane_port
    host = meta.rsplit(":", 1)[0]
    before = rss_kib(proc)
    socks = []
    for _ in range(8):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(fastrpc.hello_frame("faults", ADMIN_TOKEN))
        fastrpc.recv_frame(sock, fastrpc.RESPONSE)
        sock.sendall(fastrpc.REQUEST.pack(fastrpc.MAX_FRAME - 1, fastrpc.METHOD_IDS["Exists"]) + b"x" * 100)
        socks.append(sock)
    with KVClient(meta) as client:  # others are served meanwhile
        client.put("k", b"v")
        assert client.get("k") == b"v"
    grown = rss_kib(proc) - before
    for sock in socks:
        sock.close()
    assert grown < 16 << 10, f"8 announced 64 MiB frames grew the service by {grown} KiB"


def test_item_tables_announcing_65536_grants_cost_the_daemon_nothing_until_they_arrive(served):
    proc, meta = served
    with KVClient(meta, ClientConfig(transports=("tcp",))) as client:
        client.put("k", b"v")
        segment = client.stats().daemons[0].segments[0]
        host, port = endpoint_address(segment, "tcp").rsplit(":", 1)
        before = rss_kib(proc)
        socks = []
        for _ in range(40):
            sock = socket.create_connection((host, int(port)), timeout=10)
            head = tcp_wire.REQUEST_HEADER.pack(tcp_wire.MAGIC, tcp_wire.VERSION, 1, 8, tcp_wire.MAX_ITEMS)
            sock.sendall(head + b"seg-nope")
            socks.append(sock)
        assert client.get("k") == b"v"
        grown = rss_kib(proc) - before
        for sock in socks:
            sock.close()
    assert grown < 16 << 10, f"40 announced item tables grew the daemon by {grown} KiB"


def test_connections_past_the_cap_are_refused_typed_and_others_are_served(faults):
    caps = {"KVSTORE_META_MAX_CONNECTIONS_PER_PEER": "6"}
    _, meta = faults.meta(caps)
    faults.daemon(meta, "64MiB")
    port = MetaClient(meta).call(ServiceInfo()).fast_lane_port
    host = meta.rsplit(":", 1)[0]
    held = [socket.create_connection((host, port), timeout=10) for _ in range(6)]
    wait_until(lambda: _refused(host, port), what="a connection past the cap to be refused")
    for sock in held:
        sock.close()
    with KVClient(meta) as client:  # gRPC is not capped; the lane frees up again
        client.put("k", b"v")
        wait_until(
            lambda: client.get("k") == b"v" and client.meta.fast_lane_port == port,
            timeout=20,
            what="the fast lane to serve again",
        )


def _refused(host: str, port: int) -> bool:
    with socket.create_connection((host, port), timeout=10) as sock:
        status, body = _frame(sock)
        if status == 6:  # ErrorCode.UNAVAILABLE, then closed
            assert b"limit" in body
            return True
        return False


def _frame(sock: socket.socket) -> tuple[int, bytes]:
    try:
        (_, status), body = fastrpc.recv_frame(sock, fastrpc.RESPONSE)
        return status, body
    except (EOFError, ConnectionResetError, TimeoutError):
        return -1, b""


# The other caller, in a process of its own (as another engine would be, so that what is measured
# is the service, not the big client's hold on this process's GIL): it polls `exists` until its
# stdin closes, then prints when each call finished (perf_counter: CLOCK_MONOTONIC, shared by
# processes) and how long each took.
_POLLER = """
import json, sys, threading, time
from kvstore.client import KVClient
with KVClient(sys.argv[1]) as other:
    other.exists("warm")
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    print("ready", flush=True)
    finished, latencies = [], []
    while not done.is_set():
        started = time.perf_counter()
        other.exists("k")
        latencies.append(time.perf_counter() - started)
        finished.append(time.perf_counter())
print(json.dumps({"finished": finished, "latencies": latencies}), flush=True)
"""


def test_a_maximum_batch_does_not_stall_another_callers_exists(served):
    _, meta = served
    keys = [f"big/{i}" for i in range(MAX_BATCH_KEYS)]
    with KVClient(meta) as big:
        with pytest.raises(InvalidArgument, match="limit"):
            big.exists_many([*keys, "one/more"])
        poller = subprocess.Popen(
            [sys.executable, "-c", _POLLER, meta], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert poller.stdout is not None and poller.stdout.readline() == "ready\n"
            started = time.perf_counter()
            try:
                big.put_many(keys, [b"v" * 64] * len(keys))
            finally:
                batch_s = time.perf_counter() - started
                out, _ = poller.communicate(timeout=60)
        finally:
            poller.kill()
        assert big.exists_many(keys) == [True] * len(keys)
    polled = json.loads(out)
    finished, latencies = polled["finished"], polled["latencies"]
    # The other caller went on throughout: its calls kept completing in every quarter of the
    # batch (a batch that held the service would leave a quarter, or all, without one).
    assert len(latencies) > 10
    quarters = {min(3, int(4 * (t - started) / batch_s)) for t in finished if started <= t <= started + batch_s}
    assert quarters == {0, 1, 2, 3}, (sorted(quarters), max(latencies), statistics.median(latencies), batch_s)
