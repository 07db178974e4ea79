"""A put evicts only what it needs, where it can use it: a suspected daemon or space still under a
live grant never makes one put empty the cache. Fake clock, invariants after each test."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.grant import LOCAL
from kvstore.meta.state import GRACE_S
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.meta_helpers import SIGNER, commit, segment

BLOCK = 4096
BLOCKS = 64
LEASE = 5.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _store(clock: FakeClock, **cfg: Any) -> MetaStore:
    config = MetaConfig(heartbeat_ttl_s=1000, suspect_ttl_s=10, write_grant_ttl_s=1, lease_ttl_s=LEASE, **cfg)
    store = MetaStore(config, SIGNER, clock)
    store.mount_segment(segment("s1", "d1", Tier.DRAM, BLOCKS * BLOCK))
    return store


@pytest.fixture
def store(clock: FakeClock):
    s = _store(clock)
    yield s
    s.check_invariants()


def _fill(store: MetaStore, clock: FakeClock, n: int, prefix: str = "old") -> list[str]:
    keys = [f"{prefix}/{i}" for i in range(n)]
    reply = store.put_start(keys, [BLOCK] * n)
    assert all(r.code is ErrorCode.OK for r in reply.results)
    commit(store, keys, reply.results)
    clock.advance(2 + GRACE_S)  # their write grants are spent and expired
    return keys


def _suspect(store: MetaStore, key: str) -> None:
    """A reader over tcp could not reach the daemon holding `key`, and says so."""
    [got] = store.get([key], client_id="reader").results
    store.get([], released=[got.lease_id], client_id="reader", failed_segments=["s1"])


def _stored(store: MetaStore, keys: list[str]) -> int:
    return sum(store.exists(keys))


def test_a_put_on_a_suspected_daemon_with_room_evicts_nothing(store, clock):
    keys = _fill(store, clock, BLOCKS // 10)
    _suspect(store, keys[0])
    [r] = store.put_start(["new"], [BLOCK]).results
    assert r.code is ErrorCode.OK
    assert _stored(store, keys) == len(keys)
    assert store.stats().evictions == 0


def test_a_put_into_a_full_store_whose_every_daemon_is_suspected_evicts_what_it_needs(clock):
    store = _store(clock, high_watermark=1.0, low_watermark=0.99)  # no watermark eviction: the put's own only
    keys = _fill(store, clock, BLOCKS)
    _suspect(store, keys[-1])
    clock.advance(LEASE + GRACE_S + 0.1)  # the reader's grant is gone too
    store.tick()
    [r] = store.put_start(["new"], [BLOCK]).results
    assert r.code is ErrorCode.OK
    assert store.stats().evictions == 1
    assert _stored(store, keys) == BLOCKS - 1
    store.check_invariants()


def test_reports_of_daemons_the_reporter_was_given_no_grant_on_are_ignored(clock):
    store = _store(clock)
    store.mount_segment(segment("s2", "d2", Tier.DRAM, BLOCKS * BLOCK))
    keys = _fill(store, clock, 4)
    store.get([], client_id="stranger", failed_segments=["s1", "s2"])  # holds no lease
    store.put_revoke([], failed_segments=["s1", "s2"])  # no put of its own
    store.put_end([], [], failed_segments=["s1", "s2"])
    placed = set()
    for i in range(8):
        [r] = store.put_start([f"new/{i}"], [BLOCK]).results
        placed |= {g.segment_id for g in r.grants}
        commit(store, [f"new/{i}"], [r])
    assert placed == {"s1", "s2"}  # neither daemon was avoided
    assert _stored(store, keys) == 4
    store.check_invariants()


def _read_over_tcp(store: MetaStore, keys: list[str]) -> None:
    """Each key read once by a tcp reader that hands its lease back at once."""
    for key in keys:
        [got] = store.get([key], client_id="reader").results
        assert not got.grants[0].flags & LOCAL
        store.get([], released=[got.lease_id], client_id="reader")


def test_a_put_waits_for_evicted_space_a_live_grant_still_covers_rather_than_evicting_on(clock):
    store = _store(clock, high_watermark=1.0, low_watermark=0.99)
    keys = _fill(store, clock, BLOCKS)
    _read_over_tcp(store, keys)  # every block's grant stays honourable for LEASE seconds
    answers = [store.put_start([f"new/{i}"], [BLOCK]).results[0] for i in range(12)]
    assert all(a.code is ErrorCode.NO_SPACE for a in answers)
    assert all(0 < a.retry_after_ms <= (LEASE + GRACE_S) * 1000 + 1 for a in answers)
    assert store.stats().evictions <= 12  # at most one block per put; the space on its way back counts
    assert _stored(store, keys) >= BLOCKS - 12
    clock.advance(answers[0].retry_after_ms / 1000 + 0.001)
    store.tick()
    [r] = store.put_start(["new/0"], [BLOCK]).results
    assert r.code is ErrorCode.OK
    store.check_invariants()


def test_upkeep_does_not_evict_again_for_space_already_on_its_way_back(clock):
    store = _store(clock, high_watermark=0.9, low_watermark=0.8)
    keys = _fill(store, clock, BLOCKS)
    _read_over_tcp(store, keys)
    store.tick()
    first = store.stats().evictions
    assert first == BLOCKS - int(BLOCKS * 0.8)  # down to the low watermark
    for _ in range(5):
        clock.advance(0.5)  # the evicted space is still under its grants
        store.tick()
    assert store.stats().evictions == first
    store.check_invariants()
