"""The nixl transport against a real NixlServer (its own NIXL agent, UCX backend over tcp) in this
process: behaviour, the client's own checks, what NIXL refuses, a stopped and restarted daemon;
and in child processes, a missing library and a clean exit."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

if importlib.util.find_spec("nixl_cu12") is None and importlib.util.find_spec("nixl") is None:
    pytest.skip("the nixl transport needs the nixl extra: pip install 'kvcachestore[nixl]'", allow_module_level=True)

from kvstore.checksum import checksum
from kvstore.config import DaemonConfig
from kvstore.errors import InvalidArgument, PermissionDenied, TransportError
from kvstore.transport import nixl_staging
from kvstore.transport.base import Transfer
from kvstore.transport.nixl_agent import ADDRESS_VERSION, parse_address
from kvstore.transport.nixl_client import NixlTransport
from kvstore.transport.nixl_server import NixlServer
from kvstore.types import Endpoint, GrantMode, SegmentInfo, Tier
from tests.transport_harness import (
    CAPACITY,
    BytesSegment,
    Daemon,
    deadline,
    get,
    later_ms,
    put,
    round_trips_from_threads,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class NeverAsked(BytesSegment):
    """A segment the daemon holds but does not register: a one-sided transport never asks for it."""

    def read_into(self, offset: int, dest: memoryview) -> None:
        raise AssertionError("a one-sided transport never asks the daemon")

    def write_from(self, offset: int, src: memoryview) -> None:
        raise AssertionError("a one-sided transport never asks the daemon")


def start_daemon(shm_dir: str) -> Daemon[NixlServer]:
    return Daemon(shm_dir, NixlServer, plain=NeverAsked("seg-ssd", 1 << 20))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon[NixlServer]]:
    d = start_daemon(str(tmp_path_factory.mktemp("shm")))
    yield d
    d.close()


@pytest.fixture
def own_daemon(tmp_path) -> Iterator[Daemon[NixlServer]]:
    d = start_daemon(str(tmp_path))
    yield d
    d.close()


@pytest.fixture
def client() -> Iterator[NixlTransport]:
    c = NixlTransport()
    yield c
    c.close()


def read(daemon: Daemon[NixlServer], client: NixlTransport, info: SegmentInfo, length: int) -> bytes:
    out = bytearray(length)
    client.read(info, [Transfer(daemon.grant(0, length, GrantMode.READ), memoryview(out))], deadline())
    return bytes(out)


# --- behaviour -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 100, 4096, 65537, 1 << 20, (8 << 20) + 3])
def test_round_trip_is_byte_identical(daemon: Daemon[NixlServer], client: NixlTransport, size: int) -> None:
    data = os.urandom(size)
    put(daemon, client, 12345, data)
    assert bytes(daemon.dram.view(12345, size)) == data
    assert get(daemon, client, 12345, size) == data


def test_batches_are_split_into_staging_rounds(daemon: Daemon[NixlServer], client: NixlTransport, monkeypatch) -> None:
    monkeypatch.setattr(nixl_staging, "STAGING_BYTES", 1 << 20)  # rounds of at most 1 MiB
    blocks = [os.urandom(1 + i % 300) for i in range(1000)] + [os.urandom((3 << 20) + 5)]
    offsets = [i * 512 for i in range(1000)] + [1 << 20]
    info = daemon.info()
    written = client.write(
        info,
        [Transfer(daemon.grant(o, len(b), GrantMode.WRITE), memoryview(b)) for o, b in zip(offsets, blocks)],
        deadline(),
    )
    assert written.checksums == [checksum(b) for b in blocks] and written.receipts is None
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


def test_eight_threads_share_one_transport(daemon: Daemon[NixlServer], client: NixlTransport) -> None:
    round_trips_from_threads(daemon, client, rounds=20, size_step=9973)


def test_only_dram_segments_are_offered_with_their_metadata(daemon: Daemon[NixlServer]) -> None:
    ep = daemon.server.endpoint(daemon.dram)
    assert ep is not None and ep.address.startswith(f"{ADDRESS_VERSION}|kvstore-daemon-")
    peer = parse_address(ep.address)
    assert peer.base > 0
    assert peer.agent.encode() in peer.metadata  # NIXL's own serialisation names its agent
    assert daemon.server.endpoint(daemon.plain) is None


@pytest.mark.parametrize("address", ["", "v0|a|1|AAAA", "v1|a|notanint|AAAA", "v1|a|1|not base64!", "v1|a|1"])
def test_an_address_that_does_not_parse_is_not_reachable(client: NixlTransport, address: str) -> None:
    info = SegmentInfo("s", "d", Tier.DRAM, 100, (Endpoint("nixl", address),))
    assert not client.can_reach(info)
    with pytest.raises(TransportError, match="no nixl endpoint"):
        client.read(info, [], deadline())


def test_nixl_refuses_memory_outside_the_segment(daemon: Daemon[NixlServer], client: NixlTransport) -> None:
    """No grant check runs on the daemon; what bounds a client that goes through NIXL is that only
    segment memory is registered. One that lies to itself about the capacity is refused."""
    lying = daemon.info(capacity=CAPACITY + (1 << 20))
    grant = daemon.grant(CAPACITY - 10, 100, GrantMode.READ)
    with pytest.raises(TransportError, match="refused"):
        client.read(lying, [Transfer(grant, memoryview(bytearray(100)))], deadline())
    assert get(daemon, client, 0, 10) == bytes(daemon.dram.view(0, 10))  # and it serves on


def test_client_confines_itself_to_its_grants(daemon: Daemon[NixlServer], client: NixlTransport) -> None:
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


def test_stopped_daemon_fails_within_the_deadline_and_a_restart_is_reached(
    own_daemon: Daemon[NixlServer], client: NixlTransport
) -> None:
    daemon = own_daemon
    put(daemon, client, 0, b"before")
    old = daemon.info()
    daemon.server.stop()  # its agent is gone: the connection to it fails
    started = time.monotonic()
    with pytest.raises(TransportError):
        client.read(old, [Transfer(daemon.grant(0, 6, GrantMode.READ), memoryview(bytearray(6)))], deadline(3.0))
    assert time.monotonic() - started < 3.0 + 1.0  # bounded by its deadline, not hung
    with pytest.raises(TransportError, match="a moment ago"):  # the next call fails at once
        read(daemon, client, old, 6)
    daemon.server = daemon.start_server(DaemonConfig())  # a new agent: a new name, new metadata
    new = daemon.info()
    assert parse_address(new.endpoints[0].address).agent != parse_address(old.endpoints[0].address).agent
    assert read(daemon, client, new, 6) == b"before"


# --- in child processes ----------------------------------------------------------------------------


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_process_that_moved_bytes_exits_cleanly() -> None:
    """UCX's ib module, loaded on a host without RDMA devices, made every process that had started
    a UCX backend die at exit (SIGSEGV in libnl-route's destructor): start_agent leaves it out."""
    out = run_child(
        """
        import tempfile
        from tests.transport_harness import Daemon, get, put
        from kvstore.transport.nixl_client import NixlTransport
        from kvstore.transport.nixl_server import NixlServer
        daemon, client = Daemon(tempfile.mkdtemp(), NixlServer), NixlTransport()
        put(daemon, client, 0, b"x" * 4096)
        assert get(daemon, client, 0, 4096) == b"x" * 4096
        print("moved")
        """
    )
    assert "moved" in out.stdout, out.stderr
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_missing_library_names_the_extra() -> None:
    out = run_child(
        """
        import sys
        sys.modules["nixl_cu12"] = None  # import fails as if not installed
        sys.modules["nixl"] = None
        from kvstore.errors import Unavailable
        from kvstore.transport import registry
        for side in (registry.client_class, registry.server_class):
            try:
                side("nixl")
            except Unavailable as exc:
                print(exc)
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("pip install 'kvcachestore[nixl]'") == 2, out.stdout
