"""A metadata call's hops share one timeout (found by the fleet's leader-from-clients scenario):
a standby that names a leader this client cannot reach, then the leader's silence, cost the call
`timeout_s` in all, where each hop used to get the whole of it (three timeouts for one call, seven
for a put). Fake channels on a fake monotonic clock: no service, no sleep."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvstore.clock import FakeClock
from kvstore.errors import NotLeader, Unavailable
from kvstore.metaclient import client as metaclient

STANDBY, LEADER = "10.0.0.1:50051", "10.0.0.2:50051"


class Hop:
    """A service as one client sees it: a standby answers NotLeader at once; an unreachable
    leader takes the whole timeout it is given, then fails."""

    def __init__(self, address: str, clock: FakeClock, timeouts: list[tuple[str, float]]) -> None:
        self.address, self.clock, self.timeouts = address, clock, timeouts

    def call(self, name: str, request: Any, timeout_s: float | None = None) -> Any:
        given = 2.0 if timeout_s is None else timeout_s
        self.timeouts.append((self.address, given))
        if self.address == STANDBY:
            raise NotLeader("a standby", leader=LEADER)
        self.clock.advance(given)
        raise Unavailable("metadata service unreachable or too slow")


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(metaclient, "time", SimpleNamespace(monotonic=fake.monotonic, sleep=fake.advance))
    return fake


def test_a_call_via_a_standby_to_an_unreachable_leader_takes_one_timeout_in_all(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
):
    timeouts: list[tuple[str, float]] = []
    client = metaclient.MetaClient(f"{STANDBY},{LEADER}", timeout_s=2.0, token="")
    monkeypatch.setattr(client, "_channel", lambda address: Hop(address, clock, timeouts))
    begun = clock.monotonic()
    with pytest.raises(Unavailable):
        client._call("Get", object(), repeatable=True)
    assert clock.monotonic() - begun <= 2.0, timeouts
    assert timeouts[0] == (STANDBY, 2.0) and timeouts[1][0] == LEADER


def test_retry_s_adds_to_the_timeout_and_no_more(clock: FakeClock, monkeypatch: pytest.MonkeyPatch):
    timeouts: list[tuple[str, float]] = []
    client = metaclient.MetaClient(f"{STANDBY},{LEADER}", timeout_s=2.0, token="")
    monkeypatch.setattr(client, "_channel", lambda address: Hop(address, clock, timeouts))
    begun = clock.monotonic()
    with pytest.raises(Unavailable):
        client._call("Get", object(), retry_s=3.0, repeatable=True)
    assert clock.monotonic() - begun <= 2.0 + 3.0, timeouts
