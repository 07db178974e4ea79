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


def test_a_full_live_daemon_evicts_rather_than_placing_on_a_suspect_one():
    clock = FakeClock()
    store = _store(clock)
    keys = [f"old/{i}" for i in range(4)]
    reply = store.put_start(keys, [BLOCK] * 4)
    commit(store, keys, reply.results)
    assert {s for r in reply.results for s in _segments_of(r)} == {"live", "gone"}
    store.put_revoke([], ["gone"])                      # a client failed to reach it: suspect
    clock.advance(5)                                    # old grants expired: their space is usable
    for i in range(6):
        [r] = store.put_start([f"new/{i}"], [BLOCK]).results
        assert r.code is ErrorCode.OK and _segments_of(r) == {"live"}, (i, r)
        commit(store, [f"new/{i}"], [r])
    store.check_invariants()


def test_only_suspects_with_room_still_take_a_put():
    clock = FakeClock()
    store = _store(clock)
    store.put_revoke([], ["live"])                      # the live one is suspect too: no better place
    [r] = store.put_start(["k"], [BLOCK]).results
    assert r.code is ErrorCode.OK and _segments_of(r) <= {"live", "gone"}
    store.check_invariants()
