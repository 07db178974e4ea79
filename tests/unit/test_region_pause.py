"""A client whose service does not answer asks it for a region once per pause, not once per value.

Found by the fleet's leader-from-clients scenario (tests/fleet/faults.py): with the leader cut off
from the client, every small value of a put batch asked for a region again, because the pause
after a failed Reserve was counted from before the call, and the call (timeouts, standby, leader
again) outlasts the pause: a batch of 4 spent 4 such calls before its PutStart. No fleet, no root."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvstore.client import regions
from kvstore.clock import FakeClock
from kvstore.errors import Unavailable

CALL_S = 6.0  # what a Reserve to an unreachable leader costs (three hops of a 2 s timeout)


class Unanswered:
    """A metadata service that never answers: each call fails after CALL_S."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.calls = clock, 0

    def call(self, req: Any, timeout_s: float | None = None, retry_s: float = 0.0) -> Any:
        self.calls += 1
        self.clock.advance(CALL_S)
        raise Unavailable("metadata service unreachable or too slow")


def test_a_failed_reserve_pauses_from_when_it_failed(monkeypatch: pytest.MonkeyPatch):
    clock = FakeClock()
    monkeypatch.setattr(regions, "time", SimpleNamespace(monotonic=clock.monotonic))
    meta = Unanswered(clock)
    pool = regions.RegionPool(meta, "client", "host", 1 << 20, 64 << 10, clock)  # type: ignore[arg-type]
    assert [pool.take(4096) for _ in range(4)] == [None] * 4  # the values of one batch: PutStart
    assert meta.calls == 1
    clock.advance(regions.PAUSE_S[Unavailable.code])
    assert pool.take(4096) is None
    assert meta.calls == 2  # once the pause is over, it asks again
