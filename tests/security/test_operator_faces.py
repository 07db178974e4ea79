"""The operator's faces (the admin HTTP port, the KV events sockets, a daemon's /metrics) over real
`kvstore serve` / `kvstore meta` processes: they listen on hosts of their own, loopback unless
told otherwise, whatever `--host` the tenants' gRPC port has; every write on the admin face and
`/debug/invariants` need the operator's token; an idle or trickling client cannot hold a handler
thread past the request timeout, and connections past the cap are answered 503 at once."""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from kvstore.metaclient.client import MetaClient
from kvstore.results import TenantInfo
from kvstore.wire.calls import TenantAdd, TenantToken
from tests.cluster import ADMIN_TOKEN, found, wait_until

LOOPBACK = "127.0.0.1"


def field(proc, name: str) -> str:
    return found(rf"{name}=(\S+)", proc.ready_line).group(1)


def request(url: str, body: Any = None, token: str | None = None, method: str | None = None) -> tuple[int, Any]:
    """(status, JSON answer) of one HTTP call; `token` goes as `Authorization: Bearer`."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(url, data, headers, method=method or ("GET" if data is None else "POST"))
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def outward_address() -> str | None:
    """An address of this host other than loopback, or None where it has none."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("198.51.100.1", 9))  # no packet is sent: this only picks the route's source
        found = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if found.startswith("127.") else found


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=10).close()
    except ConnectionRefusedError:
        return False
    return True


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_operator_faces_listen_on_loopback_whatever_the_service_host(cluster):
    proc, meta = cluster.serve(
        "32MiB", "--host", "0.0.0.0", "--admin-port", "0", "--events-port", "0", "--metrics-port", "0"
    )
    admin, metrics = field(proc, "admin"), field(proc, "metrics")
    assert admin.startswith(f"{LOOPBACK}:") and metrics.startswith(f"{LOOPBACK}:"), proc.ready_line
    status, events = request(f"http://{admin}/events")
    assert status == 200
    assert events["endpoint"].startswith(f"tcp://{LOOPBACK}:") and events["replay_endpoint"].startswith(
        f"tcp://{LOOPBACK}:"
    ), events
    outward = outward_address()
    if outward is None:
        pytest.skip("this host has no address but loopback to try the faces from")
    assert reachable(outward, port_of(meta)), "the tenants' gRPC port should listen on every address (--host)"
    for face in (admin, metrics, events["endpoint"], events["replay_endpoint"]):
        assert not reachable(outward, port_of(face)), f"{face} answers on {outward}"


def test_each_face_has_a_host_setting_of_its_own(cluster, tmp_path):
    """Through the one loader: a flag (admin_host), the environment (events_host), the TOML file
    (the daemon's metrics_host)."""
    config = tmp_path / "kvstore.toml"
    config.write_text('[daemon]\nmetrics_host = "127.0.0.4"\n')
    proc, _ = cluster.serve(
        "32MiB",
        "--config",
        str(config),
        "--admin-host",
        "127.0.0.2",
        "--admin-port",
        "0",
        "--events-port",
        "0",
        "--metrics-port",
        "0",
        env={"KVSTORE_META_EVENTS_HOST": "127.0.0.3"},
    )
    admin, metrics = field(proc, "admin"), field(proc, "metrics")
    assert admin.startswith("127.0.0.2:") and metrics.startswith("127.0.0.4:"), proc.ready_line
    assert request(f"http://{admin}/events")[1]["endpoint"].startswith("tcp://127.0.0.3:")


@pytest.fixture(scope="module")
def service():
    """`kvstore meta` with its admin face, and a tenant's token: (admin address, gRPC address, tenant token)."""
    from tests.cluster import Cluster

    cluster = Cluster()
    proc, meta = cluster.meta({"KVSTORE_META_ADMIN_PORT": "0"})
    with MetaClient(meta) as operator:
        operator.call(TenantAdd(TenantInfo("team-a")))
        _, tenant_token = operator.call(TenantToken("team-a"))
    yield "http://" + field(proc, "admin"), meta, tenant_token
    cluster.close()


def routers(admin: str) -> list[str]:
    return [r["url"] for r in request(f"{admin}/dashboard/data")[1]["routers"]]


def test_dashboard_routers_take_the_operators_token_only(service):
    admin, _, tenant_token = service
    wanted = {"url": "http://169.254.169.254/latest"}
    for token in (None, "", "kvsa_not-the-operators-token"):
        status, answer = request(f"{admin}/dashboard/routers", wanted, token)
        assert status == 401 and "token" in answer["error"], (token, answer)
    status, answer = request(f"{admin}/dashboard/routers", wanted, tenant_token)
    assert status == 403 and "operator" in answer["error"], answer
    assert routers(admin) == [], "a refused write stored its router"

    mine = {"url": "http://127.0.0.1:9"}
    assert request(f"{admin}/dashboard/routers", mine, ADMIN_TOKEN) == (200, {"routers": [mine["url"]]})
    assert routers(admin) == [mine["url"]]


def registration(listener: socket.socket, instance: str) -> dict[str, Any]:
    """A KV event publisher to register: `listener`'s address, where a dial shows."""
    return {
        "endpoint": f"tcp://{LOOPBACK}:{listener.getsockname()[1]}",
        "instance_id": instance,
        "modelname": "m",
        "block_size": 4,
    }


def test_register_dials_nothing_without_the_operators_token(service):
    admin, _, tenant_token = service
    unwanted, wanted = socket.create_server((LOOPBACK, 0)), socket.create_server((LOOPBACK, 0))
    try:
        for token in (None, "kvsa_wrong", tenant_token):
            status, answer = request(f"{admin}/register", registration(unwanted, "intruder"), token)
            assert status in (401, 403) and "token" in answer["error"], (token, answer)
            assert request(f"{admin}/unregister", {"instance_id": "decode-0"}, token)[0] in (401, 403)
        status, _ = request(f"{admin}/register", registration(wanted, "decode-0"), ADMIN_TOKEN)
        assert status == 200
        wanted.settimeout(30)
        wanted.accept()[0].close()  # the operator's registration dialled its endpoint...
        unwanted.setblocking(False)
        with pytest.raises(BlockingIOError):
            unwanted.accept()  # ...and, by then, no refused one had dialled its own
        query = {"model": "m", "token_ids": [1, 2, 3, 4], "block_size": 4}
        status, answer = request(f"{admin}/query", query)  # reads stay open on the operator's host
        assert status == 200 and "intruder" not in answer["default"]
        assert request(f"{admin}/unregister", {"instance_id": "decode-0"}, ADMIN_TOKEN)[0] == 200
    finally:
        unwanted.close()
        wanted.close()


def test_debug_invariants_takes_the_operators_token(service):
    admin, _, tenant_token = service
    assert request(f"{admin}/debug/invariants")[0] == 401
    assert request(f"{admin}/debug/invariants", token=tenant_token)[0] == 403
    assert request(f"{admin}/debug/invariants", token=ADMIN_TOKEN) == (200, {"ok": True})
    assert request(f"{admin}/health") == (200, {"ok": True})  # cheap reads need no token
    assert request(f"{admin}/dashboard/data")[0] == 200


def closed_by_server(sock: socket.socket, trickle: bytes = b"", give_up_s: float = 120.0) -> bool:
    """Wait until the server closes `sock` (True), sending `trickle` a byte at a time meanwhile;
    False if it is still open after `give_up_s` (a failure bound, not a measure)."""
    deadline = time.monotonic() + give_up_s
    pending = iter(trickle)
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            try:
                return sock.recv(1024) == b""
            except ConnectionResetError:
                return True
        byte = next(pending, None)
        if byte is not None:
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                return True
    return False


def test_a_client_that_sends_nothing_or_trickles_holds_no_thread(cluster):
    proc, _ = cluster.meta({"KVSTORE_META_ADMIN_PORT": "0", "KVSTORE_META_ADMIN_REQUEST_TIMEOUT_S": "2"})
    admin = field(proc, "admin")
    with socket.create_connection(("127.0.0.1", port_of(admin))) as idle:
        assert request(f"http://{admin}/health") == (200, {"ok": True})  # served while the idle one holds on
        assert closed_by_server(idle), "an idle connection was kept open"
    with socket.create_connection(("127.0.0.1", port_of(admin))) as trickler:
        header = b"GET /health HTTP/1.0\r\nX-Slow: " + b"a" * 60_000  # a byte every 50 ms: never idle long
        assert closed_by_server(trickler, header), "a request trickled a byte at a time was kept open"
    assert request(f"http://{admin}/health") == (200, {"ok": True})


def test_connections_past_the_cap_are_answered_503_at_once(cluster):
    proc, _ = cluster.meta(
        {
            "KVSTORE_META_ADMIN_PORT": "0",
            "KVSTORE_META_ADMIN_MAX_CONNECTIONS": "2",
            "KVSTORE_META_ADMIN_REQUEST_TIMEOUT_S": "600",
        }
    )
    admin = field(proc, "admin")
    held = [socket.create_connection(("127.0.0.1", port_of(admin))) for _ in range(2)]
    try:
        status, answer = request(f"http://{admin}/health")  # both handler threads wait on idle clients
        assert status == 503 and "busy" in answer["error"], answer
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: request(f"http://{admin}/health")[0] == 200, what="the slots of closed connections")
