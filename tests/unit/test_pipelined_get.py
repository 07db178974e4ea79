"""A large get_many_into locates its keys LOCATE_KEYS at a time, the next run's Get in flight while
this run's bytes are copied; what it returns (and raises) is what one Get of every key gave."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kvstore.client import KVClient, reader
from kvstore.config import ClientConfig
from kvstore.errors import KeyNotFound, Unavailable
from kvstore.transport.shm import ShmTransport
from kvstore.wire.calls import Get
from tests.inprocess import InProcessStore

N = 1000  # four runs: 256, 256, 256, 232


class Gets:
    """The reader's metadata client, logging each Get of keys it begins and answers into `log`
    (beside the reads), and losing the answer of the `fail_at`-th."""

    def __init__(self, inner: Any, log: list[str], fail_at: int = 0) -> None:
        self.inner, self.log, self.fail_at, self.begun = inner, log, fail_at, 0

    def begin(self, req: Any, timeout_s: float | None = None) -> Callable[[], Any]:
        if not (isinstance(req, Get) and req.keys):
            return self.inner.begin(req, timeout_s)
        self.begun += 1
        n, wait = self.begun, self.inner.begin(req, timeout_s)
        self.log.append(f"begin {n} ({len(req.keys)})")

        def answer() -> Any:
            reply = wait()
            if n == self.fail_at:
                raise Unavailable("the answer of a Get was lost")
            self.log.append(f"answer {n}")
            return reply

        return answer

    def call(self, req: Any, timeout_s: float | None = None, retry_s: float = 0.0) -> Any:
        if isinstance(req, Get) and req.keys:
            self.log.append(f"call ({len(req.keys)})")
        return self.inner.call(req, timeout_s, retry_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


SLOW_S = 1.5  # a read this slow outlasts the read leases of the slow tests' service


@pytest.fixture
def client(monkeypatch, request):
    """A client whose shm reads are logged; with the parameter "slow", the first takes SLOW_S
    (a slow link) and the service's read leases last 1 s."""
    log: list[str] = []
    read = ShmTransport.read
    slow = getattr(request, "param", "") == "slow"

    def logged(self, segment, transfers, deadline):
        log.append(f"read {len(transfers)}")
        digests = read(self, segment, transfers, deadline)
        if slow and sum(e.startswith("read") for e in log) == 1:
            time.sleep(SLOW_S)  # the bytes came in time, slowly
        return digests

    monkeypatch.setattr(ShmTransport, "read", logged)
    env = {"KVSTORE_META_LEASE_TTL_S": "1.0"} if slow else None
    with (
        InProcessStore(env, dram_size=64 << 20, segment_size=64 << 20) as store,
        KVClient(store.address, ClientConfig(transports=("shm",), region_bytes=0)) as c,
    ):
        c.log = log  # type: ignore[attr-defined]
        yield c


def stored(client: KVClient, n: int = N) -> tuple[list[str], list[bytes]]:
    keys, values = [f"k{i}" for i in range(n)], [os.urandom(32) * 32 for _ in range(n)]
    client.put_many(keys, values)
    return keys, values


def read_logged(client: Any) -> tuple[list[str], list[np.ndarray]]:
    """Stored values read back in one get_many_into, logging its Gets from its first (and checked)."""
    keys, values = stored(client)
    client._reader._meta = Gets(client._reader._meta, client.log)
    client.log.clear()
    buffers = [np.empty(1024, dtype=np.uint8) for _ in keys]
    assert client.get_many_into(keys, buffers) == [1024] * N
    assert [b.tobytes() for b in buffers] == values
    return keys, buffers


def test_the_next_run_is_located_while_this_one_is_read(client):
    keys, buffers = read_logged(client)
    assert client.log == [
        "begin 1 (256)", "answer 1", "begin 2 (256)", "read 256", "answer 2", "begin 3 (256)", "read 256",
        "answer 3", "begin 4 (232)", "read 256", "answer 4", "read 232",
    ]  # fmt: skip
    client.log.clear()
    assert client.get_many_into(keys, buffers) == [1024] * N  # cached: no Get
    assert not [e for e in client.log if e.startswith("begin")]


def test_a_miss_in_a_later_run_is_reported_in_place(client):
    keys, values = stored(client)
    client.remove(keys[900])
    buffers = [np.empty(1024, dtype=np.uint8) for _ in keys]
    out = client.get_many_into(keys, buffers, strict=False)
    assert isinstance(out[900], KeyNotFound) and out[:900] == [1024] * 900 and out[901:] == [1024] * 99
    with pytest.raises(KeyNotFound):
        client.get_many_into(keys, buffers)
    assert [buffers[i].tobytes() for i in range(900)] == values[:900]


def test_a_lost_answer_is_raised_and_the_client_goes_on(client):
    keys, values = stored(client)
    client._reader._meta = gets = Gets(client._reader._meta, client.log, fail_at=2)
    buffers = [np.empty(1024, dtype=np.uint8) for _ in keys]
    with pytest.raises(Unavailable, match="lost"):
        client.get_many_into(keys, buffers)
    assert gets.begun == 2  # nothing more was asked once an answer was lost
    client._reader._meta = gets.inner
    assert client.get_many_into(keys, buffers) == [1024] * N
    assert [b.tobytes() for b in buffers] == values


def test_runs_are_of_locate_keys():
    assert reader.LOCATE_KEYS == 256 and -(-N // reader.LOCATE_KEYS) == 4  # as the tests above assume


@pytest.mark.parametrize("client", ["slow"], indirect=True)
def test_a_run_whose_grants_ran_out_while_another_was_read_is_located_again(client):
    """The first run's read outlasts the read lease of the second run's Get, sent before it: the
    second run is located again (its leases handed back), and no Get is sent ahead of a read while
    the last read was that slow."""
    read_logged(client)
    assert client.log == [
        "begin 1 (256)", "answer 1", "begin 2 (256)", "read 256", "answer 2", "call (256)", "read 256",
        "call (256)", "begin 3 (232)", "read 256", "answer 3", "read 232",
    ]  # fmt: skip  # and once reads are quick again, the next Get goes ahead of the read
