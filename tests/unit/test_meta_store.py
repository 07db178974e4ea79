"""MetaStore behaviour driven by a fake clock, with check_invariants() after every step."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.meta.state import GRACE_S as REVOKE_GRACE_S
from kvstore.meta.store import MetaStore
from kvstore.types import GrantMode, Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment

SEG = 64 * 1024


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    cfg = MetaConfig(lease_ttl_s=5, put_lease_ttl_s=10, heartbeat_ttl_s=10, high_watermark=0.9, low_watermark=0.5)
    s = MetaStore(cfg, SIGNER, clock)
    yield s
    s.check_invariants()


def mount(store, daemon="d1", seg="s1", capacity=SEG):
    store.mount_segment(segment(seg, daemon, Tier.DRAM, capacity))


def put(store, keys, size=1024, replicas=1):
    res = store.put_start(keys, [size] * len(keys), replicas).results
    store.check_invariants()
    commit(store, keys, res)
    store.check_invariants()
    return res


def test_lifecycle_pending_complete_removed(store):
    mount(store)
    [r] = store.put_start(["a"], [100]).results
    assert r.code is ErrorCode.OK and r.grants[0].mode is GrantMode.WRITE and r.grants[0].length == 100
    assert store.exists(["a"]) == [False]
    assert store.get(["a"]).results[0].code is ErrorCode.KEY_BUSY
    assert store.put_start(["a"], [100]).results[0].code is ErrorCode.KEY_BUSY
    # asked twice: OK twice (a writer trusted with mooncake, which gives no receipt)
    assert store.put_end(["a"], [42], unchecked_ok=True).results == store.put_end(["a"], [42]).results
    [g] = store.get(["a"]).results
    assert (g.code, g.size, g.checksum) == (ErrorCode.OK, 100, 42)
    assert store.put_start(["a"], [100]).results[0].code is ErrorCode.ALREADY_EXISTS
    assert store.remove(["a"], force=True)[0].code is ErrorCode.OK
    assert store.get(["a"]).results[0].code is ErrorCode.KEY_NOT_FOUND
    store.check_invariants()


def test_match_prefix_counts_leading_complete_keys(store):
    mount(store)
    put(store, ["k0", "k1", "k2", "k4"])
    assert store.match_prefix(["k0", "k1", "k2", "k3", "k4"]) == 3
    assert store.match_prefix(["x", "k0"]) == 0
    assert store.match_prefix([]) == 0


def test_bad_keys_and_sizes_are_invalid_argument(store):
    mount(store)
    for keys, sizes in ([[""], [1]], [["x" * 1025], [1]], [["a"], [0]], [["a", "b"], [1]]):
        with pytest.raises(InvalidArgument):
            store.put_start(keys, sizes)
    [r] = store.put_start(["huge"], [SEG + 1]).results
    assert r.code is ErrorCode.INVALID_ARGUMENT and "larger than any segment" in r.message


def test_lru_eviction_order(store, clock):
    mount(store)  # 64 KiB; watermarks 0.9 / 0.5; 16 blocks of 4 KiB fill it
    keys = [f"k{i}" for i in range(14)]
    for k in keys:
        put(store, [k], size=4096)
    store.get(["k0"])  # k0 becomes most recently used
    clock.advance(6)  # its read lease ends
    store.tick()
    put(store, ["n0", "n1"], size=4096)  # 16 blocks: past the high watermark
    alive = [k for k in keys if store.exists([k])[0]]
    assert "k0" in alive and "k1" not in alive and "k2" not in alive
    assert store.stats().used <= SEG * 0.5
    assert store.stats().evictions > 0


def test_read_lease_protects_from_eviction_and_remove(store, clock):
    mount(store)
    put(store, ["old"], size=4096)
    store.get(["old"])  # lease for 5 s
    assert store.remove(["old"])[0].code is ErrorCode.KEY_BUSY
    for i in range(20):
        put(store, [f"f{i}"], size=4096)
        assert store.exists(["old"]) == [True]
    clock.advance(6)
    store.tick()
    for i in range(20, 40):
        put(store, [f"f{i}"], size=4096)
    assert store.exists(["old"]) == [False]


def test_force_remove_keeps_a_leased_range_until_its_readers_are_done(store, clock):
    mount(store, capacity=4096)
    put(store, ["a"], size=4096)  # fills the segment
    [read] = store.get(["a"]).results[0].grants  # a reader is copying these bytes for 5 s
    assert store.remove(["a"], force=True)[0].code is ErrorCode.OK
    assert store.exists(["a"]) == [False] and store.get(["a"]).results[0].code is ErrorCode.KEY_NOT_FOUND
    assert store.put_start(["b"], [4096]).results[0].code is ErrorCode.NO_SPACE  # never the reader's range
    store.check_invariants()
    clock.advance(5 + REVOKE_GRACE_S + 1)  # the lease, and the grace for late transfers
    store.tick()
    [b] = store.put_start(["b"], [4096]).results
    assert b.code is ErrorCode.OK and b.grants[0].offset == read.offset
    store.put_end(["b"], [1], unchecked_ok=True)


def test_a_released_lease_no_longer_holds_the_key(store, clock):
    mount(store)
    put(store, ["a"])
    [first] = store.get(["a"]).results
    [second] = store.get(["a"]).results  # two readers: two leases
    assert first.lease_id != second.lease_id
    assert store.remove(["a"], released=[first.lease_id])[0].code is ErrorCode.KEY_BUSY
    assert store.remove(["a"], released=[second.lease_id, 12345])[0].code is ErrorCode.OK  # unknown ids: ignored
    store.get(["b"], released=[first.lease_id])  # a release that comes twice changes nothing
    store.check_invariants()


def test_force_removed_space_is_freed_when_its_last_reader_releases(store, clock):
    mount(store, capacity=4096)
    put(store, ["a"], size=4096)
    leases = [store.get(["a"], client_host=HOST).results[0].lease_id for _ in range(2)]  # shm readers
    store.remove(["a"], force=True)
    store.get([], released=leases[:1])
    assert store.put_start(["b"], [4096]).results[0].code is ErrorCode.NO_SPACE  # one reader still copying
    store.get([], released=leases[1:])
    assert store.put_start(["b"], [4096]).results[0].code is ErrorCode.OK  # no tick needed
    store.put_end(["b"], [1], unchecked_ok=True)
    store.tick()  # the retired record is not freed a second time
    store.check_invariants()


def test_unmount_forgets_retired_space(store, clock):
    mount(store)
    put(store, ["a"])
    store.get(["a"])
    store.remove(["a"], force=True)
    store.unmount_segment("s1")
    store.check_invariants()
    clock.advance(6)
    store.tick()  # the retired range went with its segment
    mount(store)
    put(store, ["a"])


def test_exists_does_not_take_a_lease(store):
    mount(store)
    put(store, ["a"])
    store.exists(["a"])
    store.match_prefix(["a"])
    assert store.remove(["a"])[0].code is ErrorCode.OK


def test_nothing_evictable_is_no_space(store):
    mount(store)
    keys = [f"k{i}" for i in range(8)]
    put(store, keys, size=8192)
    store.get(keys)  # all leased
    [r] = store.put_start(["more"], [8192]).results
    assert r.code is ErrorCode.NO_SPACE


def test_unfinished_put_is_revoked_and_space_reclaimed(store, clock):
    mount(store)
    store.put_start(["zombie"], [SEG // 2])
    used = store.stats().used
    clock.advance(10 + REVOKE_GRACE_S + 0.1)
    store.heartbeat("d1", ["s1"])
    store.tick()
    store.check_invariants()
    assert store.stats().used == used - SEG // 2 and store.stats().revoked_puts == 1
    assert store.put_end(["zombie"], [1]).results[0].code is ErrorCode.KEY_NOT_FOUND
    assert store.put_start(["zombie"], [10]).results[0].code is ErrorCode.OK


def test_stale_pending_put_does_not_block_the_key(store, clock):
    mount(store)
    store.put_start(["k"], [10])
    clock.advance(10 + REVOKE_GRACE_S + 1)
    assert store.put_start(["k"], [10]).results[0].code is ErrorCode.OK  # no tick needed


def _silence(store, clock, seconds, speaking=("d1", ["s1"])):
    """`seconds` pass in 4 s steps, `speaking` heartbeating and the store ticking."""
    for _ in range(int(seconds // 4)):
        clock.advance(4)
        assert store.heartbeat(*speaking) == []
        store.tick()
        store.check_invariants()


def test_a_silent_daemon_is_set_aside_and_its_blocks_come_back_with_it(store, clock):
    """DROPPED (docs/fleet.md): a daemon cut off from the service, but alive, keeps its
    DRAM; when it comes back its acknowledged puts must be readable, not gone."""
    mount(store, "d1", "s1")
    mount(store, "d2", "s2")
    twice = [f"k{i}" for i in range(6)]
    put(store, twice, size=1024, replicas=2)
    once = [f"one{i}" for i in range(8)]
    on_s2 = [k for k, r in zip(once, put(store, once, size=1024)) if r.grants[0].segment_id == "s2"]
    assert on_s2
    _silence(store, clock, 12)  # d2 silent for 12 s > its 10 s TTL
    assert {d.daemon_id for d in store.stats().daemons} == {"d1"}  # out of service...
    assert store.exists(twice + on_s2) == [True] * (len(twice) + len(on_s2))  # ...its blocks kept
    assert all([g.segment_id for g in r.grants] == ["s1"] for r in store.get(twice).results)
    assert {r.code for r in store.get(on_s2).results} == {ErrorCode.UNAVAILABLE}  # retry, not a miss
    assert all(r.grants[0].segment_id == "s1" for r in put(store, ["new0", "new1"], size=1024, replicas=2))
    assert store.reconciling == 0  # not a takeover's
    assert store.heartbeat("d2", ["s2"]) == ["s2"]  # back: told to mount again
    mount(store, "d2", "s2")
    store.check_invariants()
    assert {d.daemon_id for d in store.stats().daemons} == {"d1", "d2"}
    assert all(r.code is ErrorCode.OK and r.grants[0].segment_id == "s2" for r in store.get(on_s2).results)
    assert all(len(r.grants) == 2 for r in store.get(twice).results)


def test_a_daemon_silent_past_its_grace_loses_its_segments(clock):
    cfg = MetaConfig(heartbeat_ttl_s=10, silent_grace_s=20)
    store = MetaStore(cfg, SIGNER, clock)
    mount(store, "d1", "s1")
    mount(store, "d2", "s2")
    put(store, [f"k{i}" for i in range(6)], size=1024, replicas=2)
    put(store, ["single"], size=1024)
    _silence(store, clock, 28)  # set aside at 12 s, 16 s later: kept
    assert store.exists(["single"]) == [True]
    _silence(store, clock, 8)  # 24 s > 20 s after it was set aside: dropped
    assert {d.daemon_id for d in store.stats().daemons} == {"d1"}
    assert all(
        len(r.grants) == 1 and r.grants[0].segment_id == "s1" for r in store.get([f"k{i}" for i in range(6)]).results
    )
    assert store.stats().keys == 6 + (store.get(["single"]).results[0].code is ErrorCode.OK)
    assert store.heartbeat("d2", ["s2"]) == ["s2"]  # a daemon coming back mounts afresh
    store.check_invariants()


def test_without_a_grace_a_silent_daemon_loses_its_segments_at_once(clock):
    store = MetaStore(MetaConfig(heartbeat_ttl_s=10, silent_grace_s=0), SIGNER, clock)
    mount(store, "d1", "s1")
    mount(store, "d2", "s2")
    put(store, [f"k{i}" for i in range(6)], size=1024, replicas=2)
    _silence(store, clock, 12)
    assert {d.daemon_id for d in store.stats().daemons} == {"d1"} and store.stats().capacity == SEG
    assert store.heartbeat("d2", ["s2"]) == ["s2"]


def test_replicas_land_on_distinct_daemons(store):
    mount(store, "d1", "s1a")
    mount(store, "d1", "s1b")
    mount(store, "d2", "s2")
    for r in put(store, [f"k{i}" for i in range(10)], size=512, replicas=2):
        assert len(r.grants) == 2
        assert {g.segment_id for g in r.grants} & {"s2"}
    [r] = put(store, ["three"], size=512, replicas=3)
    assert len(r.grants) == 2  # only two daemons: stored degraded, not refused


def test_unmount_drops_replicas(store):
    mount(store, "d1", "s1")
    put(store, ["a", "b"])
    assert store.unmount_segment("s1") == 2
    assert store.exists(["a", "b"]) == [False, False]
    assert store.stats().keys == 0
