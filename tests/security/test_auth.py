"""Every call authenticated, on both lanes, against a real `kvstore serve`: missing, forged,
truncated, expired and revoked tokens are refused typed (the fast lane closes the connection),
the service keeps serving everyone else, and a token never reaches a log line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import grpc
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import ErrorCode, PermissionDenied, Unauthenticated
from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc
from kvstore.wire import frames
from kvstore.wire.calls import Heartbeat, ServiceInfo, Stats, TenantAdd, TenantList, TenantRevoke, TenantToken
from tests.cluster import ADMIN_TOKEN, Cluster, authed_channel, wait_until


def hello(port: int, token: str) -> tuple[int, bytes, bool]:
    """A raw HELLO on the fast lane: (status, payload, whether the service then closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(frames.hello_frame("tests", token))
        (_, status), body = frames.recv_frame(sock, frames.RESPONSE)
        sock.settimeout(5)
        try:
            closed = sock.recv(1) == b""
        except TimeoutError:
            closed = False
    return status, body, closed


def bad_tokens(good: str) -> list[str]:
    return ["", "nonsense", ADMIN_TOKEN[:-1], ADMIN_TOKEN + "x", good[:-3], good[:20], good.upper(),
            "kvst_00000000_" + "A" * 43, "Bearer " + good, "x" * 5000]  # fmt: skip


@pytest.mark.parametrize("lane", [True, False], ids=["fast-lane", "grpc"])
def test_a_call_without_a_known_token_is_unauthenticated_and_others_keep_working(tenants, lane):
    address, made = tenants
    for token in bad_tokens(made["a"]):
        config = ClientConfig(token=token or "kvsa_x", fast_lane=lane, transports=("tcp",))
        with pytest.raises(Unauthenticated), KVClient(address, config) as client:  # too long: refused at once
            client.exists_many(["k"])
    with KVClient(address, ClientConfig(token=made["a"], fast_lane=lane, transports=("tcp",))) as ok:
        ok.put("still/serving", b"yes")
        assert ok.get("still/serving") == b"yes"


def test_grpc_without_metadata_is_unauthenticated(tenants):
    address, _ = tenants
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.MetaServiceStub(grpc.insecure_channel(address)).Exists(pb.ExistsRequest(keys=["k"]))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    stub = pb_grpc.MetaServiceStub(authed_channel(address, "kvst_12345678_" + "b" * 43))
    with pytest.raises(grpc.RpcError) as info:
        stub.Exists(pb.ExistsRequest(keys=["k"]))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_the_fast_lane_closes_a_connection_whose_hello_has_a_bad_token(tenants):
    address, made = tenants
    port = MetaClient(address).call(ServiceInfo()).fast_lane_port
    for token in bad_tokens(made["a"]):
        status, _body, closed = hello(port, token)
        too_long = len(token) > 4000  # over the HELLO frame's size: refused before it is read
        assert status == (ErrorCode.INVALID_ARGUMENT if too_long else ErrorCode.UNAUTHENTICATED) and closed, token
    status, _, closed = hello(port, made["a"])
    assert status == frames.OK and not closed


def test_a_revoked_token_is_refused_at_once_even_on_an_open_fast_lane_connection(tenants):
    address, _ = tenants
    with MetaClient(address) as admin:
        admin.call(TenantAdd(TenantInfo("revoked")))
        _, token = admin.call(TenantToken("revoked"))
        with KVClient(address, ClientConfig(token=token, transports=("tcp",))) as client:
            client.put("r/1", b"one")
            assert client.meta.fast_lane_port  # the connection is open and pooled
            assert admin.call(TenantRevoke("revoked")) == 1
            with pytest.raises(Unauthenticated):
                client.exists_many(["r/1"])
            with pytest.raises(Unauthenticated):
                client.get("r/1")
        _, again = admin.call(TenantToken("revoked"))  # the tenant's keys stay; a new token reaches them
        with KVClient(address, ClientConfig(token=again, transports=("tcp",))) as client:
            assert client.get("r/1") == b"one"


def test_an_expired_token_is_refused(tenants):
    address, _ = tenants
    with MetaClient(address) as admin:
        admin.call(TenantAdd(TenantInfo("brief")))
        _, token = admin.call(TenantToken("brief", ttl_s=1.0))
    with KVClient(address, ClientConfig(token=token, fast_lane=False)) as client:
        client.exists_many(["k"])
        deadline = time.monotonic() + 30  # the service's clock decides; wait for it to pass

        def refused() -> bool:
            try:
                client.exists_many(["k"])
            except Unauthenticated:
                return True
            return time.monotonic() > deadline

        wait_until(refused, what="the token to expire")
        with pytest.raises(Unauthenticated):
            client.exists_many(["k"])


def test_tenants_cannot_do_what_the_admin_and_daemons_do(tenants):
    address, made = tenants
    with MetaClient(address, token=made["a"]) as a:
        with pytest.raises(PermissionDenied):
            a.call(TenantList())
        with pytest.raises(PermissionDenied):
            a.call(TenantToken("a"))
        with pytest.raises(PermissionDenied):
            a.call(Heartbeat("some-daemon", []))
        stats = a.call(Stats())
    assert stats.tenant == "a" and not stats.daemons


def test_the_cli_finds_the_token_file_serve_made_and_no_token_reaches_a_log(tmp_path):
    """`kvstore serve` with no token set up: it makes a file only its owner can read, says where,
    and the CLI run by the same user works with no flags."""
    env = dict(os.environ, KVSTORE_TOKEN="", XDG_CONFIG_HOME=str(tmp_path), KVSTORE_LOG_LEVEL="DEBUG")
    cluster = Cluster()
    try:
        proc, address = cluster.serve("64MiB", env=env)
        token_file = tmp_path / "kvstore" / "token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        assert any(str(token_file) in line for line in proc.lines)
        token = token_file.read_text().strip()

        def kv(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "kvstore", *args, "--meta", address], env=env,
                                  capture_output=True, text=True, timeout=60)  # fmt: skip

        assert kv("put", "greeting", "hello").returncode == 0
        assert kv("get", "greeting").stdout == "hello"
        added = kv("tenant", "add", "ops")
        assert added.returncode == 0, added.stderr
        made = kv("tenant", "token", "ops")
        tenant_token = made.stdout.splitlines()[0]
        listing = kv("tenant", "list")
        assert "ops" in listing.stdout and tenant_token not in listing.stdout
    finally:
        cluster.close()
    said = "".join(proc.lines) + made.stderr + added.stderr
    assert token not in said and tenant_token not in said
