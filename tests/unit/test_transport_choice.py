"""Which transport a client takes for a segment: its first preferred one that the segment offers
and that reaches it, except that a segment on this host offering shm is reached over shm alone
whenever the client may use shm (the service then grants LOCAL, which no daemon honours)."""

from __future__ import annotations

import os

from kvstore.client.transports import Transports
from kvstore.clock import SystemClock
from kvstore.config import ClientConfig
from kvstore.hostid import host_id
from kvstore.storage.dram import DramSegment
from kvstore.types import Endpoint, SegmentInfo, Tier


def segment(path: str, host: str, *transports: str) -> SegmentInfo:
    addresses = {"shm": f"{host}|{os.getpid()}|{path}", "tcp": "127.0.0.1:1"}
    return SegmentInfo("seg", "d1", Tier.DRAM, 1 << 20, tuple(Endpoint(t, addresses[t]) for t in transports), host)


def test_a_local_shm_segment_is_reached_over_shm_whatever_the_order(tmp_path) -> None:
    dram = DramSegment("seg", 1 << 20, str(tmp_path))
    try:
        transports = Transports(ClientConfig(transports=("tcp", "shm")), SystemClock())
        assert transports.host == host_id()  # so the service grants LOCAL here
        local = segment(str(dram.path), host_id(), "tcp", "shm")
        assert transports.usable(local) == ("shm",)
        assert transports.for_segment(local).name == "shm"
        elsewhere = segment(str(dram.path), "another-host", "tcp", "shm")
        assert transports.for_segment(elsewhere).name == "tcp"
        transports.close()
    finally:
        dram.close()


def test_without_shm_the_preference_order_decides(tmp_path) -> None:
    transports = Transports(ClientConfig(transports=("tcp",)), SystemClock())
    assert transports.host == ""  # no LOCAL grants for this client
    local = segment(str(tmp_path / "none"), host_id(), "tcp", "shm")
    assert transports.usable(local) == ("tcp",)
    assert transports.for_segment(local).name == "tcp"
    transports.close()


def test_a_client_preferring_inproc_to_shm_is_served() -> None:
    """The store's daemon serves inproc and shm; the grants are LOCAL, so shm moves the bytes."""
    from kvstore.client import KVClient
    from tests.inprocess import InProcessStore

    with (
        InProcessStore(dram_size=64 << 20) as store,
        KVClient(store.address, ClientConfig(transports=("inproc", "shm"))) as client,
    ):
        assert client.put("k", b"v" * 1000) is True
        assert client.get("k") == b"v" * 1000
