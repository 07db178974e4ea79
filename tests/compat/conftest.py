"""Fixtures for the compatibility tests: a real kvstore (`kvstore serve`, from tests/cluster.py)
and, where the `mooncake` wheel is installed, a real mooncake_master on loopback."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tests.cluster import Cluster

MOONCAKE_MISSING = importlib.util.find_spec("mooncake") is None
needs_mooncake = pytest.mark.skipif(
    MOONCAKE_MISSING,
    reason="the real Mooncake Store is not installed (pip install 'kvcachestore[mooncake]'): nothing to compare with",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def kvstore_meta() -> Iterator[str]:
    """`kvstore serve` (64 MiB DRAM, no SSD) for a whole module: its meta address."""
    c = Cluster()
    try:
        _, meta = c.serve("64MiB")
        yield meta
    finally:
        c.close()


@pytest.fixture(scope="module")
def mooncake_master() -> Iterator[str]:
    """A real mooncake_master bound to 127.0.0.1, waited for by its "Master service started"
    line; its RPC address. (It takes no port 0: the port is picked free just before.)"""
    if MOONCAKE_MISSING:
        pytest.skip("mooncake is not installed")
    from benchmarks.peers.mooncake import master_binary

    rpc = _free_port()
    popen = subprocess.Popen(
        [
            master_binary(),
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={_free_port()}",
            "--enable_metric_reporting=false",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started = threading.Event()
    log: list[str] = []
    stdout = popen.stdout
    assert stdout is not None  # stdout=PIPE

    def pump() -> None:
        for line in stdout:
            log.append(line)
            if "Master service started" in line:
                started.set()
        started.set()  # exited: the check below reports it

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not started.wait(60) or popen.poll() is not None:
            pytest.fail("mooncake_master did not start:\n" + "".join(log[-20:]))
        yield f"127.0.0.1:{rpc}"
    finally:
        popen.terminate()
        try:
            popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


def python_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process run from the repository root."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
