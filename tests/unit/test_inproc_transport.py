"""The inproc reference transport against a real InprocServer in this process: byte-identical
round trips on segments with and without a view, and every grant the daemon's checker refuses
refused here too, with nothing moved."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvstore.errors import PermissionDenied, TransportError
from kvstore.transport import registry
from kvstore.transport.base import Transfer
from kvstore.transport.inproc import InprocServer, InprocTransport
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo, Tier
from tests.transport_harness import CAPACITY, BytesSegment, Daemon, deadline, get, put, round_trips_from_threads


@pytest.fixture
def daemon(tmp_path) -> Iterator[Daemon[InprocServer]]:
    d = Daemon(str(tmp_path), InprocServer)
    yield d
    d.close()


@pytest.fixture
def client() -> Iterator[InprocTransport]:
    c = InprocTransport()
    yield c
    c.close()


def test_registered_by_name() -> None:
    assert registry.client_class("inproc") is InprocTransport
    assert registry.server_class("inproc") is InprocServer
    assert "inproc" not in registry.unconfined()  # every byte range is checked by the daemon


@pytest.mark.parametrize("size", [1, 100, 65537, (8 << 20) + 3])
def test_round_trip_is_byte_identical(daemon: Daemon[InprocServer], client: InprocTransport, size: int) -> None:
    data = os.urandom(size)
    put(daemon, client, 12345, data)  # checks the checksums and the daemon's receipts too
    assert bytes(daemon.dram.view(12345, size)) == data
    assert get(daemon, client, 12345, size) == data


def test_segment_without_view(daemon: Daemon[InprocServer], client: InprocTransport) -> None:
    assert isinstance(daemon.plain, BytesSegment)  # the harness's default segment without view()
    info, data = daemon.info(daemon.plain), os.urandom(5000)
    client.write(info, [Transfer(daemon.grant(7, 5000, GrantMode.WRITE, "seg-plain"), memoryview(data))], deadline())
    assert bytes(daemon.plain.data[7:5007]) == data
    out = bytearray(5000)
    client.read(info, [Transfer(daemon.grant(7, 5000, GrantMode.READ, "seg-plain"), memoryview(out))], deadline())
    assert out == data


def test_eight_threads_share_one_transport(daemon: Daemon[InprocServer], client: InprocTransport) -> None:
    round_trips_from_threads(daemon, client, rounds=20, size_step=997)


@pytest.mark.parametrize("mode", [GrantMode.READ, GrantMode.WRITE])
@pytest.mark.parametrize("bad", ["forged", "unknown_segment"])
def test_grants_the_daemon_refuses(
    daemon: Daemon[InprocServer], client: InprocTransport, mode: GrantMode, bad: str
) -> None:
    """Grants that pass the client's own checks and only the daemon's checker can refuse."""
    put(daemon, client, 0, os.urandom(1 << 20))
    before = daemon.snapshot()
    info, good = daemon.info(daemon.dram), daemon.grant(0, 4096, mode)
    if bad == "forged":
        grant = Grant(good.segment_id, good.offset, good.length, mode, good.expires_ms, bytes(16))
    else:
        grant = daemon.grant(0, 4096, mode, segment="nope")
        info = SegmentInfo("nope", "d1", Tier.DRAM, CAPACITY, info.endpoints)
    transfers = [Transfer(grant, memoryview(bytearray(4096)))]
    if bad == "forged":  # a valid item first: nothing moves unless every grant checks
        transfers.insert(0, Transfer(good, memoryview(bytearray(4096))))
    with pytest.raises(PermissionDenied):
        (client.write if mode is GrantMode.WRITE else client.read)(info, transfers, deadline())
    assert daemon.snapshot() == before


def test_a_write_grant_writes_once(daemon: Daemon[InprocServer], client: InprocTransport) -> None:
    grant, info = daemon.grant(0, 5, GrantMode.WRITE), daemon.info()
    client.write(info, [Transfer(grant, memoryview(b"first"))], deadline())
    with pytest.raises(PermissionDenied, match="used already"):
        client.write(info, [Transfer(grant, memoryview(b"again"))], deadline())
    assert get(daemon, client, 0, 5) == b"first"


def test_only_servers_of_this_process_serving_now_are_reached(
    daemon: Daemon[InprocServer], client: InprocTransport
) -> None:
    info = daemon.info()
    assert client.can_reach(info)
    host, _, number = info.endpoints[0].address.split("|")
    elsewhere = SegmentInfo(
        info.segment_id, "d1", Tier.DRAM, CAPACITY, (Endpoint("inproc", f"{host}|{os.getpid() + 1}|{number}"),)
    )
    assert not client.can_reach(elsewhere)
    daemon.server.stop()
    assert not client.can_reach(info)
    with pytest.raises(TransportError, match="not served"):
        get(daemon, client, 0, 10)
    daemon.restart()  # a new server: a new number, so the old endpoint stays dead
    assert not client.can_reach(info) and client.can_reach(daemon.info())
