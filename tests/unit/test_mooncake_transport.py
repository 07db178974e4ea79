"""The mooncake transport against a real MooncakeServer (its own Transfer Engine): in this process
for behaviour and the client's own checks, in a child process for a daemon that is killed or
hung mid-call."""

from __future__ import annotations

import importlib.util
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("mooncake") is None:
    pytest.skip(
        "the mooncake transport needs the mooncake extra: pip install 'kvcachestore[mooncake]'", allow_module_level=True
    )

import numpy as np

from kvstore.checksum import checksum
from kvstore.config import DaemonConfig
from kvstore.errors import InvalidArgument, PermissionDenied, TransportError
from kvstore.grant import GrantSigner
from kvstore.transport import mooncake_client, mooncake_staging
from kvstore.transport.base import Transfer
from kvstore.transport.mooncake_client import MooncakeTransport
from kvstore.transport.mooncake_server import MooncakeServer
from kvstore.types import Endpoint, GrantMode, SegmentInfo, Tier
from tests.cluster import wait_until
from tests.tcp_relay import RetargetableRelay
from tests.transport_harness import (
    CAPACITY,
    SECRET,
    BytesSegment,
    Daemon,
    deadline,
    get,
    later_ms,
    put,
    round_trips_from_threads,
)


class NeverAsked(BytesSegment):
    """A segment the daemon holds but does not register: a one-sided transport never asks for it."""

    def read_into(self, offset: int, dest: memoryview) -> None:
        raise AssertionError("a one-sided transport never asks the daemon")

    def write_from(self, offset: int, src: memoryview) -> None:
        raise AssertionError("a one-sided transport never asks the daemon")


def start_daemon(shm_dir: str) -> Daemon[MooncakeServer]:
    return Daemon(shm_dir, MooncakeServer, plain=NeverAsked("seg-ssd", 1 << 20))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon[MooncakeServer]]:
    """Shared by the tests that leave the daemon serving (an engine takes ~1 s to shut down)."""
    d = start_daemon(str(tmp_path_factory.mktemp("shm")))
    yield d
    d.close()


@pytest.fixture
def own_daemon(tmp_path) -> Iterator[Daemon[MooncakeServer]]:
    d = start_daemon(str(tmp_path))
    yield d
    d.close()


@pytest.fixture
def client() -> Iterator[MooncakeTransport]:
    c = MooncakeTransport()
    yield c
    c.close()


# --- behaviour -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 100, 4096, 65537, 1 << 20, (8 << 20) + 3])
def test_round_trip_is_byte_identical(daemon: Daemon[MooncakeServer], client: MooncakeTransport, size: int) -> None:
    data = os.urandom(size)
    put(daemon, client, 12345, data)
    assert bytes(daemon.dram.view(12345, size)) == data
    assert get(daemon, client, 12345, size) == data


def test_batches_are_split_into_staging_rounds_and_engine_calls(
    daemon: Daemon[MooncakeServer], client: MooncakeTransport, monkeypatch
) -> None:
    monkeypatch.setattr(mooncake_staging, "STAGING_BYTES", 1 << 20)  # rounds of 1 MiB ...
    monkeypatch.setattr(mooncake_client, "_MAX_ENTRIES", 64)  # ... of at most 64 entries per call
    blocks = [os.urandom(1 + i % 300) for i in range(1000)] + [os.urandom((3 << 20) + 5)]
    offsets = [i * 512 for i in range(1000)] + [1 << 20]
    info = daemon.info()
    client.write(
        info,
        [Transfer(daemon.grant(o, len(b), GrantMode.WRITE), memoryview(b)) for o, b in zip(offsets, blocks)],
        deadline(),
    )
    outs = [bytearray(len(b)) for b in blocks]
    digests = client.read(
        info,
        [
            Transfer(daemon.grant(o, len(b), GrantMode.READ), memoryview(out))
            for o, b, out in zip(offsets, blocks, outs)
        ],
        deadline(),
    )
    assert [bytes(o) for o in outs] == blocks
    assert digests == [checksum(b) for b in blocks]


def test_eight_threads_share_one_transport(daemon: Daemon[MooncakeServer], client: MooncakeTransport) -> None:
    round_trips_from_threads(daemon, client, rounds=20, size_step=9973)


def test_only_dram_segments_are_offered(daemon: Daemon[MooncakeServer]) -> None:
    ep = daemon.server.endpoint(daemon.dram)
    assert ep is not None
    protocol, base, session, incarnation = ep.address.split("|")
    assert protocol == "tcp" and int(base) > 0 and session.startswith("127.0.0.1:") and incarnation
    assert daemon.server.endpoint(daemon.plain) is None


def test_engine_refuses_memory_outside_the_segment(daemon: Daemon[MooncakeServer], client: MooncakeTransport) -> None:
    """No grant check runs on the daemon; what bounds a peer is that only segment memory is
    registered. A client that lies to itself about the capacity is refused by the engine."""
    lying = daemon.info(capacity=CAPACITY + (1 << 20))
    grant = daemon.grant(CAPACITY - 10, 100, GrantMode.READ)
    with pytest.raises(TransportError):
        client.read(lying, [Transfer(grant, memoryview(bytearray(100)))], deadline())
    assert get(daemon, client, 0, 10) == bytes(daemon.dram.view(0, 10))  # and it serves on


def test_client_confines_itself_to_its_grants(daemon: Daemon[MooncakeServer], client: MooncakeTransport) -> None:
    info, read_grant = daemon.info(), daemon.grant(0, 10, GrantMode.READ)
    for transfer in (
        Transfer(read_grant, memoryview(bytearray(9))),  # wrong size
        Transfer(daemon.grant(0, 10, GrantMode.WRITE), memoryview(bytearray(10))),
        Transfer(read_grant, memoryview(bytes(10))),  # read-only
        Transfer(read_grant, memoryview(bytearray(20))[::2]),  # strided
    ):
        with pytest.raises(InvalidArgument):
            client.read(info, [transfer], deadline())
    past_the_end = daemon.grant(CAPACITY - 5, 10, GrantMode.READ)
    with pytest.raises(PermissionDenied, match="outside the segment"):
        client.read(info, [Transfer(past_the_end, memoryview(bytearray(10)))], deadline())
    expired = daemon.grant(0, 10, GrantMode.WRITE, expires_ms=later_ms(-1))
    with pytest.raises(PermissionDenied, match="expired"):
        client.write(info, [Transfer(expired, memoryview(bytes(10)))], deadline())
    expired = daemon.grant(0, 10, GrantMode.READ, expires_ms=later_ms(-1))  # its space may be reused
    with pytest.raises(PermissionDenied, match="expired"):
        client.read(info, [Transfer(expired, memoryview(bytearray(10)))], deadline())


def test_stopped_daemon_fails_fast_and_a_restart_is_reached(
    own_daemon: Daemon[MooncakeServer], client: MooncakeTransport
) -> None:
    daemon = own_daemon
    put(daemon, client, 0, b"before")
    old = daemon.info()
    daemon.server.stop()  # its engine and ports are gone
    for _ in range(3):  # every call fails at once, none waits
        started = time.monotonic()
        with pytest.raises(TransportError, match="stopped"):
            client.read(old, [Transfer(daemon.grant(0, 6, GrantMode.READ), memoryview(bytearray(6)))], deadline())
        assert time.monotonic() - started < 1.0
    daemon.server = daemon.start_server(DaemonConfig())  # a new engine: a new session name
    assert daemon.info().endpoints != old.endpoints
    assert get(daemon, client, 0, 6) == b"before"


def test_a_new_engine_under_a_dead_ones_session_name_is_reached(
    own_daemon: Daemon[MooncakeServer], client: MooncakeTransport
) -> None:
    """An engine draws its ports at random (15000-17000) and a port is free again a minute after
    its engine stopped, so a new engine on the host can come back under the session name
    (host:rpc port) that the client's engine reached a dead one at, whose descriptor (the dead
    engine's data port) it keeps. Forced here: both engines are advertised under one relay."""
    daemon = own_daemon
    assert daemon.server._engine is not None  # started
    relay = RetargetableRelay(daemon.server._engine.get_rpc_port())
    try:
        alias = f"127.0.0.1:{relay.port}"
        daemon.server._session = alias  # internal on purpose: the name the engine drew
        put(daemon, client, 0, b"before")
        old = daemon.info()
        daemon.server.stop()
        daemon.server = daemon.start_server(DaemonConfig())
        assert daemon.server._engine is not None  # started
        relay.target = daemon.server._engine.get_rpc_port()
        daemon.server._session = alias
        assert [e.address.split("|")[2] for e in daemon.info().endpoints] == [alias]  # the same name
        assert get(daemon, client, 0, 6) == b"before"
        with pytest.raises(TransportError, match="stopped"):  # the old one is not looked for there
            client.read(old, [Transfer(daemon.grant(0, 6, GrantMode.READ), memoryview(bytearray(6)))], deadline())
    finally:
        relay.close()


def test_the_engine_is_replaced_before_it_reaches_a_peer_through_stale_state(monkeypatch) -> None:
    """The rules of mooncake_client._Engines, on stand-in engines (which ports a real engine draws
    cannot be chosen; the test above forces the first rule on real ones)."""
    engines = mooncake_client._Engines
    for name, value in (("_engine", None), ("_reached", {}), ("_gone_on", set()), ("_latest", {})):
        monkeypatch.setattr(engines, name, value)
    monkeypatch.setattr(mooncake_client, "local_host_towards", lambda session: "127.0.0.1")
    monkeypatch.setattr(mooncake_client, "start_engine", lambda host, protocol, device: object())

    def reach(session: str, incarnation: str) -> object:
        return engines.get("tcp", "", session, incarnation)

    first = reach("10.0.0.1:15001", "0001")
    assert reach("10.0.0.1:15001", "0001") is first and reach("10.0.0.2:15002", "0002") is first
    second = reach("10.0.0.1:15001", "0003")  # a new engine under a name reached as another
    assert second is not first
    with pytest.raises(TransportError, match="stopped"):
        reach("10.0.0.1:15001", "0001")  # the older one there has stopped
    assert reach("10.0.0.2:15002", "0002") is second and reach("10.0.0.2:15004", "0004") is second
    engines.gone(second, "10.0.0.2:15004")  # a peer on 10.0.0.2 found gone
    assert reach("10.0.0.2:15002", "0002") is second and reach("10.0.0.1:15005", "0005") is second
    third = reach("10.0.0.2:15006", "0006")  # a new one on that host: it may have the dead one's data port
    assert third is not second
    assert reach("10.0.0.2:15004", "0004") is third  # the gone one again: nothing about it is stale


CHILD = textwrap.dedent("""
    import json, sys
    from kvstore.config import DaemonConfig
    from kvstore.grant import GrantSigner
    from kvstore.storage.dram import DramSegment
    from kvstore.transport.base import GrantChecker
    from kvstore.transport.mooncake_server import MooncakeServer
    seg = DramSegment("seg-dram", {capacity}, sys.argv[1])
    seg.view(0, {capacity})[:] = bytes(range(256)) * ({capacity} // 256)
    server = MooncakeServer(GrantChecker(GrantSigner({secret!r}), {{"seg-dram": seg}}.get), DaemonConfig())
    server.start()
    server.add_segment(seg)
    print(server.endpoint(seg).address, flush=True)
    sys.stdin.read()
""").format(capacity=CAPACITY, secret=SECRET)


@pytest.fixture
def child(tmp_path) -> Iterator[tuple[subprocess.Popen[str], SegmentInfo]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None  # stdout=PIPE
    address = proc.stdout.readline().strip()
    assert address, "the child daemon did not start"
    yield proc, SegmentInfo("seg-dram", "d1", Tier.DRAM, CAPACITY, (Endpoint("mooncake", address),))
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(10)


def read_from(info: SegmentInfo, client: MooncakeTransport, out: memoryview, seconds: float = 10) -> None:
    grant = GrantSigner(SECRET).sign("seg-dram", 0, len(out), GrantMode.READ, later_ms())
    client.read(info, [Transfer(grant, out)], time.monotonic() + seconds)


def test_killed_daemon_fails_fast(child, client: MooncakeTransport) -> None:
    proc, info = child
    out = memoryview(bytearray(4096))
    read_from(info, client, out)
    assert bytes(out[:4]) == bytes(range(4))
    proc.kill()
    proc.wait(10)
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(TransportError):
            read_from(info, client, out)
        assert time.monotonic() - started < 1.0


LATE = 0xAB  # what the stopped daemon's segment holds once the test rewrote it


def holds_late_bytes(staging: np.ndarray) -> bool:
    """Whether a whole 4 KiB of `staging` is LATE bytes (the old pattern has no such run)."""
    return bool((staging.reshape(-1, 4096) == LATE).all(axis=1).any())


def test_hung_daemon_fails_and_nothing_lands_late(tmp_path, child, client: MooncakeTransport) -> None:
    """The engine keeps moving bytes after a call gives up; the caller's buffer must not see them.
    Positive barrier: the resumed daemon's late bytes are seen landing in the abandoned staging."""
    proc, info = child
    read_from(info, client, memoryview(bytearray(16)))
    out = memoryview(bytearray(CAPACITY))
    failures: list[BaseException] = []
    reading = threading.Event()

    def reader() -> None:
        try:
            for _ in range(200):  # until the stop below catches one mid-transfer
                read_from(info, client, out)
                reading.set()
        except BaseException as exc:  # noqa: BLE001 - checked below
            failures.append(exc)
            reading.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert reading.wait(30), "no read completed"
    os.kill(proc.pid, signal.SIGSTOP)  # the reader is in its next call (it reads without pause)
    thread.join(30)
    assert not thread.is_alive() and failures and isinstance(failures[0], TransportError)
    out[:] = bytes(CAPACITY)  # what the caller does with its buffer next
    assert client.staging is not None and len(client.staging.abandoned) == 1
    abandoned = client.staging.abandoned[0]
    abandoned[:] = 0
    (segment_file,) = tmp_path.glob("kvstore-*-seg-dram")
    with open(segment_file, "r+b") as fh, mmap.mmap(fh.fileno(), CAPACITY) as memory:
        memory[:] = bytes([LATE]) * CAPACITY  # what the stopped daemon sends from now on
    os.kill(proc.pid, signal.SIGCONT)
    wait_until(
        lambda: holds_late_bytes(abandoned),
        timeout=20,
        what="the resumed daemon's late bytes to land in the abandoned staging",
    )
    assert out.tobytes() == bytes(CAPACITY)  # and none in the caller's buffer
    read_from(info, client, memoryview(bytearray(16)))  # and the client works on


def test_rdma_style_staging_is_registered_once(
    daemon: Daemon[MooncakeServer], client: MooncakeTransport, monkeypatch
) -> None:
    """On protocols other than tcp the engine needs registered local memory: only the staging
    buffers are registered, each once, however many calls use them."""
    # Internal state on purpose: what is counted is the engine's registrations, which no public
    # call shows, so the client's engine and staging are swapped for counting ones.
    put(daemon, client, 0, b"warm")  # creates the engine and staging
    registered: list[int] = []
    engine: Any = client._engine  # mooncake's TransferEngine: untyped

    class Counting:
        def __getattr__(self, name):
            return getattr(engine, name)

        def register_memory(self, addr: int, size: int) -> int:
            registered.append(size)
            return engine.register_memory(addr, size)

    monkeypatch.setattr(client, "_staging", mooncake_staging.Staging(register=True))
    monkeypatch.setattr(client, "_engine", Counting())
    monkeypatch.setattr(mooncake_client._Engines, "get", classmethod(lambda cls, *a: client._engine))
    for i in range(5):
        put(daemon, client, i * 4096, bytes([i]) * 4096)
        assert get(daemon, client, i * 4096, 4096) == bytes([i]) * 4096
    assert registered == [mooncake_staging.STAGING_BYTES]
    client.close()
