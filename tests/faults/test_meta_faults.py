"""The metadata service stopped or killed: callers get a typed Unavailable within their timeout
(an engine's miss), and when it is back they carry on by themselves: daemons mount again and
clients find its new fast lane."""

from __future__ import annotations

import os
import signal
import time

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import Unavailable
from tests.cluster import wait_until


def test_a_stopped_service_is_unavailable_typed_and_then_serves_again(faults):
    meta_proc, meta = faults.meta()
    faults.daemon(meta, "64MiB")
    with KVClient(meta, ClientConfig(timeout_s=2)) as client:
        client.put("k", b"v" * 4096)
        os.kill(meta_proc.pid, signal.SIGSTOP)
        # the signal is sent, not yet taken: wait until the kernel says the process is stopped
        wait_until(lambda: _state(meta_proc.pid) == "T", timeout=10, what="the service stopped")
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable):
                client.get("k")
            assert time.monotonic() - started < 30  # bounded by the call's timeout
        finally:
            os.kill(meta_proc.pid, signal.SIGCONT)
        wait_until(lambda: _get(client, "k") == b"v" * 4096, timeout=30, what="the service back")


def test_a_killed_service_restarted_on_its_port_is_found_again_by_daemons_and_clients(faults):
    meta_proc, meta = faults.meta(None, "--port", "0")
    port = meta.rsplit(":", 1)[1]
    faults.daemon(meta, "64MiB")
    with KVClient(meta, ClientConfig(timeout_s=2)) as client:
        client.put("before", b"b")
        meta_proc.kill()
        with pytest.raises(Unavailable):
            client.exists("before")
        faults.meta(None, "--port", port)  # a new service, empty (no Redis)
        wait_until(lambda: _daemons(client) == 1, timeout=30, what="the daemon to mount again")
        client.put("after", b"a")
        assert client.get("after") == b"a"
        wait_until(
            lambda: client.exists("after") and client.meta.fast_lane_port != 0,
            timeout=20,
            what="the client back on the new service's fast lane",
        )


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _get(client: KVClient, key: str) -> bytes | None:
    try:
        return client.get(key)
    except Exception:  # noqa: BLE001 - not yet
        return None


def _daemons(client: KVClient) -> int:
    try:
        return len(client.stats().daemons)
    except Exception:  # noqa: BLE001 - not yet
        return 0
