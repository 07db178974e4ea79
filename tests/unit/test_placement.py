"""Placement around a daemon clients could not reach: a put is not handed only to it while room
can be made on the others (found measuring a full store after kill -9 of a daemon: half the
puts failed until the heartbeat TTL, because the dead daemon was the only one with room)."""

from __future__ import annotations

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.meta_helpers import SIGNER, commit, segment

BLOCK = 4096


def _store(clock: FakeClock) -> MetaStore:
    cfg = MetaConfig(heartbeat_ttl_s=1000, suspect_ttl_s=10, write_grant_ttl_s=1, lease_ttl_s=1)
    store = MetaStore(cfg, SIGNER, clock)
    store.mount_segment(segment("live", "d-live", Tier.DRAM, 4 * BLOCK))
    store.mount_segment(segment("gone", "d-gone", Tier.DRAM, 4 * BLOCK))
    return store


def _segments_of(result) -> set[str]:
    return {g.segment_id for g in result.grants}


def _reader_fails_on(store: MetaStore, segment_id: str, key: str | None = None) -> None:
    """A reader got a grant on `segment_id`, could not reach it, and says so with its next Get
    (a report counts only where the reporter was given a grant)."""
    [got] = store.get([key or _stored_on(store, segment_id)], client_id="reader").results
    store.get([], released=[got.lease_id], client_id="reader", failed_segments=[segment_id])


def _stored_on(store: MetaStore, segment_id: str) -> str:
    for i in range(64):
        key = f"probe/{segment_id}/{i}"
        [r] = store.put_start([key], [BLOCK]).results
        assert r.code is ErrorCode.OK
        commit(store, [key], [r])
        if _segments_of(r) == {segment_id}:
            return key
    raise AssertionError(f"nothing was placed on {segment_id}")


def test_a_full_live_daemon_evicts_rather_than_placing_on_a_suspect_one():
    clock = FakeClock()
    store = _store(clock)
    keys = [f"old/{i}" for i in range(4)]
    reply = store.put_start(keys, [BLOCK] * 4)
    commit(store, keys, reply.results)
    assert {s for r in reply.results for s in _segments_of(r)} == {"live", "gone"}
    on_gone = next(k for k, r in zip(keys, reply.results) if _segments_of(r) == {"gone"})
    _reader_fails_on(store, "gone", on_gone)  # a client failed to reach it: suspect
    clock.advance(5)  # old grants expired: their space is usable
    for i in range(6):
        [r] = store.put_start([f"new/{i}"], [BLOCK]).results
        assert r.code is ErrorCode.OK and _segments_of(r) == {"live"}, (i, r)
        commit(store, [f"new/{i}"], [r])
    store.check_invariants()


def test_only_suspects_with_room_still_take_a_put():
    clock = FakeClock()
    store = _store(clock)
    _reader_fails_on(store, "live")  # the live one is suspect too: no better place
    [r] = store.put_start(["k"], [BLOCK]).results
    assert r.code is ErrorCode.OK and _segments_of(r) <= {"live", "gone"}
    store.check_invariants()
