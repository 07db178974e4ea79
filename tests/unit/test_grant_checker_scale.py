"""GrantChecker at the scale of a large put: the work it does per request is linear in the
request's grants, only the take itself holds the lock every transport of a daemon shares, and
forgetting expired grants costs what it forgets.

Work is counted, never timed: each grant's MAC is a bytes subclass that counts how often it is
hashed or compared, and whether the checker's lock was held at the time.
"""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from kvstore.clock import FakeClock, now_ms
from kvstore.errors import PermissionDenied
from kvstore.grant import GrantSigner
from kvstore.transport.base import GrantChecker
from kvstore.types import Grant, GrantMode

SEGMENT = "seg-scale"
CAPACITY = 1 << 40


class Tally:
    """MAC operations seen, in all and while the checker's lock was held."""

    def __init__(self) -> None:
        self.ops = 0
        self.locked_ops = 0
        self.lock: Any = None

    def count(self) -> None:
        self.ops += 1
        if self.lock is not None and self.lock.locked():
            self.locked_ops += 1


class CountedMac(bytes):
    tally: Tally

    def __eq__(self, other: object) -> bool:
        self.tally.count()
        return bytes.__eq__(self, other)

    def __hash__(self) -> int:
        self.tally.count()
        return bytes.__hash__(self)


def setup(clock: FakeClock) -> tuple[GrantChecker, GrantSigner, Tally]:
    signer = GrantSigner(b"s" * 16)
    segment = SimpleNamespace(capacity=CAPACITY)
    # A stand-in segment: the checker reads only its capacity.
    checker = GrantChecker(signer, {SEGMENT: segment}.get, clock)  # type: ignore[arg-type]
    tally = Tally()
    tally.lock = checker._lock  # shared by all of a daemon's transports
    return checker, signer, tally


def grants(signer: GrantSigner, tally: Tally, first: int, count: int, expires_ms: int) -> list[Grant]:
    mac = type("Mac", (CountedMac,), {"tally": tally})
    out = []
    for i in range(first, first + count):
        g = signer.sign(SEGMENT, i * 4096, 4096, GrantMode.WRITE, expires_ms)
        out.append(dataclasses.replace(g, mac=mac(g.mac)))
    return out


@pytest.mark.parametrize("n", [1024, 4096])
def test_a_write_request_costs_a_few_mac_operations_per_grant(n: int) -> None:
    clock = FakeClock()
    checker, signer, tally = setup(clock)
    request = grants(signer, tally, 0, n, now_ms(clock) + 60_000)
    checker.check_all(request, GrantMode.WRITE)
    # Linear: a bounded number of hashes/comparisons per grant, not one per earlier grant.
    assert tally.ops <= 6 * n, tally.ops
    assert tally.locked_ops <= 3 * n, tally.locked_ops
    with pytest.raises(PermissionDenied, match="used already"):
        checker.check_all(request[n // 2 : n // 2 + 1], GrantMode.WRITE)


def test_a_duplicate_within_a_request_is_refused_without_taking_the_shared_lock() -> None:
    clock = FakeClock()
    checker, signer, tally = setup(clock)
    request = grants(signer, tally, 0, 256, now_ms(clock) + 60_000)
    with pytest.raises(PermissionDenied, match="used already"):
        checker.check_all([*request, request[100]], GrantMode.WRITE)
    assert tally.ops and tally.locked_ops == 0  # found while other writers went on
    checker.check_all(request, GrantMode.WRITE)  # nothing of the refused request was taken


def test_forgetting_expired_grants_costs_what_it_forgets() -> None:
    """Requests of 100 grants that live 50 s arrive one a second: at any time ~5,000 grants are
    remembered, and each is hashed a bounded number of times in all (the old pruning re-hashed
    every remembered grant on each request once the oldest had expired)."""
    clock = FakeClock()
    checker, signer, tally = setup(clock)
    rounds, per_round = 200, 100
    for r in range(rounds):
        checker.check_all(grants(signer, tally, r * per_round, per_round, now_ms(clock) + 50_000), GrantMode.WRITE)
        clock.advance(1.0)
    assert tally.ops <= 6 * rounds * per_round, tally.ops
    assert len(checker._taken) <= 52 * per_round  # expired grants were forgotten


def test_a_grant_forgotten_while_its_request_was_checked_is_not_taken_again() -> None:
    """A taken grant's replay passes the signature check just before the grant expires; while it
    is checked, another request forgets expired grants. The replay must not find the grant
    unknown and take it a second time."""
    clock = FakeClock()
    signer = GrantSigner(b"s" * 16)
    expires = now_ms(clock) + 1_000
    first = [signer.sign(SEGMENT, i * 64, 64, GrantMode.WRITE, expires) for i in range(5000)]
    checker: GrantChecker

    class RacingSigner(GrantSigner):
        racing = False

        def check(self, grant: Grant, mode: GrantMode, now: int, capacity: int) -> None:
            super().check(grant, mode, now, capacity)
            if self.racing:
                self.racing = False
                clock.advance(5.0)  # the replayed grant has expired by now ...
                later = signer.sign(SEGMENT, 1 << 30, 64, GrantMode.WRITE, now_ms(clock) + 60_000)
                checker.check_all([later], GrantMode.WRITE)  # ... and this request prunes it

    racing = RacingSigner(b"s" * 16)
    stand_in = SimpleNamespace(capacity=CAPACITY)  # the checker reads only its capacity
    checker = GrantChecker(racing, {SEGMENT: stand_in}.get, clock)  # type: ignore[arg-type]
    checker.check_all(first, GrantMode.WRITE)
    racing.racing = True
    with pytest.raises(PermissionDenied):
        checker.check_all(first[:1], GrantMode.WRITE)


def test_two_requests_racing_for_the_same_grants_take_them_once() -> None:
    clock = FakeClock()
    checker, signer, tally = setup(clock)
    for r in range(20):
        request = grants(signer, tally, r * 300, 300, now_ms(clock) + 60_000)
        start = threading.Barrier(2)
        won: list[bool] = []

        def take(req: list[Grant] = request, start: threading.Barrier = start, won: list[bool] = won) -> None:
            start.wait()
            try:
                checker.check_all(req, GrantMode.WRITE)
                won.append(True)
            except PermissionDenied:
                won.append(False)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(won) == [False, True]
