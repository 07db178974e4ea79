"""Removed, replaced and abandoned SSD blocks stay gone: across a daemon restart (kill -9 or a clean
stop), a restart of `kvstore serve` on the same --ssd-dir (a service that remembers nothing), and a
takeover of a service on Redis. A daemon's SSD journal names every block it ever wrote there; the
service tells it which of them it no longer holds, and refuses to adopt them from it meanwhile."""

import signal

import pytest

from kvstore.checksum import checksum
from kvstore.client import KVClient
from kvstore.clock import FakeClock
from kvstore.config import ClientConfig, MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.records import ObjectRecord, SegmentRecord
from kvstore.meta.segments import pack_location
from kvstore.meta.store import MetaStore
from kvstore.results import OK, Block, MoveOutcome
from kvstore.storage.ssd import SsdSegment
from kvstore.types import MoveKind, Tier
from tests.cluster import wait_until
from tests.ha.test_ha import writes_open
from tests.inprocess import InProcessStore
from tests.meta_helpers import SIGNER, segment
from tests.redis_server import RedisServer
from tests.workers import block

MIB = 1 << 20
# Demotion under DRAM pressure only (as tests/integration/test_tiers.py), so the newest block, a
# replacement, stays in DRAM: a restart loses it, and only the old bytes on SSD could come back.
FAST = {
    "KVSTORE_META_TICK_INTERVAL_S": "0.05",
    "KVSTORE_META_HIGH_WATERMARK": "0.8",
    "KVSTORE_META_LOW_WATERMARK": "0.6",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000",
    "KVSTORE_META_SSD_HIGH_WATERMARK": "0.9",
    "KVSTORE_META_SSD_LOW_WATERMARK": "0.8",
    "KVSTORE_META_HEARTBEAT_TTL_S": "1",
    "KVSTORE_META_SILENT_GRACE_S": "1",  # the daemon these tests kill is dead: its DRAM goes soon
    "KVSTORE_DAEMON_HEARTBEAT_INTERVAL_S": "0.2",
}
TIERS = ("--segment-size", "32MiB", "--ssd", "256MiB")
KEYS = [f"p/{i}" for i in range(40)]


def value(i: int) -> bytes:
    return block(7, i, MIB)


NEW = block(8, 0, MIB)  # the replacement's bytes


def only_on_ssd(client: KVClient) -> list[str]:
    return [info.key for info in client.describe(KEYS) if info.tiers == (Tier.SSD,)]


def some_only_on_ssd(client: KVClient) -> list[str]:
    """The keys living only on SSD once there are at least 6 of them, else []."""
    keys = only_on_ssd(client)
    return keys if len(keys) >= 6 else []


def fill_and_change(address: str) -> tuple[str, str, list[str]]:
    """Put 40 MiB through 32 MiB of DRAM; once some blocks live only on SSD, remove one and
    replace another (remove, then put other bytes, as Mooncake's upsert does). Returns (removed,
    replaced, the other SSD blocks)."""
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        for i, k in enumerate(KEYS):
            c.put(k, value(i))
        ssd = wait_until(lambda: some_only_on_ssd(c), what="blocks only on SSD")
        removed, replaced, kept = ssd[0], ssd[1], ssd[2:]
        c.remove(removed)
        c.remove(replaced)
        c.put(replaced, NEW)
        assert c.get(replaced) == NEW
    return removed, replaced, kept


def assert_gone(address: str, removed: str, replaced: str, kept: list[str]) -> None:
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        removed_back = c.exists(removed)
        replaced_now = c.get(replaced) if c.exists(replaced) else None
        # Neither comes back with its old bytes. The replacement was in DRAM: lost (or demoted meanwhile).
        assert (removed_back, "old bytes" if replaced_now not in (None, NEW) else "ok") == (False, "ok")
        for k in kept:  # the rest of SSD survives
            assert c.get(k) == value(KEYS.index(k)), k


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_removed_and_replaced_ssd_blocks_stay_gone_after_a_daemon_restart(cluster, tmp_path, how):
    _, address = cluster.meta(FAST)
    ssd = ["--ssd-dir", str(tmp_path / "ssd"), *TIERS]
    daemon = cluster.daemon(address, "32MiB", FAST, *ssd)
    removed, replaced, kept = fill_and_change(address)
    if how == "kill":
        daemon.kill()  # no goodbye: the service drops it by heartbeat
    else:
        daemon.stop()  # it unmounts its segments
    with KVClient(address) as c:
        wait_until(lambda: not c.exists(replaced), what="the service to drop the daemon's DRAM")
    cluster.daemon(address, "32MiB", FAST, *ssd)  # ready once it re-announced its SSD blocks
    assert_gone(address, removed, replaced, kept)


def test_removed_and_replaced_ssd_blocks_stay_gone_after_serve_restarts(cluster, tmp_path):
    ssd = ("--ssd-dir", str(tmp_path / "ssd"), *TIERS)
    proc, address = cluster.serve("32MiB", *ssd, env=FAST)
    removed, replaced, kept = fill_and_change(address)
    proc.stop()
    _, address = cluster.serve("32MiB", *ssd, env=FAST)  # a service that knows only the SSD journal
    assert_gone(address, removed, replaced, kept)


@pytest.mark.parametrize("survivor", ["daemon", "nothing"])
def test_a_removed_ssd_block_stays_gone_after_a_takeover(cluster, tmp_path, survivor):
    """The leader dies with the deletion not yet told to the daemon; the next leader, loaded from
    Redis, knows the block is gone, whether the daemon lived on (paused meanwhile) or restarted."""
    redis = RedisServer(tmp_path / "redis").start()
    try:
        env = {
            **FAST,
            "KVSTORE_META_REDIS_URL": redis.url,
            "KVSTORE_META_HEARTBEAT_TTL_S": "6",
            "KVSTORE_META_LEADER_TTL_S": "2",
            "KVSTORE_META_LEADER_RENEW_S": "0.3",
            "KVSTORE_META_LEASE_TTL_S": "2",
            "KVSTORE_META_WRITE_GRANT_TTL_S": "2",
        }
        meta, address = cluster.meta(env)
        ssd = ["--ssd-dir", str(tmp_path / "ssd"), *TIERS]
        daemon = cluster.daemon(address, "32MiB", FAST, *ssd)
        wait_until(lambda: writes_open(address), what="the leader to open for writes")
        with KVClient(address, ClientConfig(timeout_s=60)) as c:
            for i, k in enumerate(KEYS):
                c.put(k, value(i))
            ssd_keys = wait_until(lambda: some_only_on_ssd(c), what="blocks only on SSD")
            removed, kept = ssd_keys[0], ssd_keys[1:]
            if survivor == "daemon":
                daemon.popen.send_signal(signal.SIGSTOP)  # it hears of nothing from now on
            else:
                daemon.kill()
            c.remove(removed)
        meta.kill()
        port = address.rsplit(":", 1)[1]
        cluster.meta(env, "--port", port)  # the same Redis, the same address
        if survivor == "daemon":
            daemon.popen.send_signal(signal.SIGCONT)  # it mounts its segments again, re-announces
        wait_until(lambda: writes_open(address), timeout=60, what="the new leader to reconcile")
        if survivor == "daemon":
            daemon.stop()
        cluster.daemon(address, "32MiB", FAST, *ssd)  # re-announces what its journal still names
        with KVClient(address, ClientConfig(timeout_s=60)) as c:
            assert c.exists(removed) is False
            for k in kept:
                assert c.get(k) == value(KEYS.index(k)), k
    finally:
        redis.stop()


# Every block demoted as soon as no one reads it.
ALL_ON_SSD = {
    "KVSTORE_META_HIGH_WATERMARK": "1e-12",
    "KVSTORE_META_LOW_WATERMARK": "1e-13",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000000",
    "KVSTORE_META_TICK_INTERVAL_S": "0.05",
}


@pytest.mark.parametrize("restart", ["daemon", "service"])
def test_an_abandoned_move_does_not_come_back(tmp_path, restart):
    """The daemon copies and journals a demotion, but the service abandons it (the block was read
    meanwhile); the block is removed later. Its bytes on SSD must not be adopted again."""
    settings = {"dram_size": 8 * MIB, "segment_size": 8 * MIB, "ssd_dir": str(tmp_path / "ssd"), "ssd_size": 64 * MIB}
    store = InProcessStore(ALL_ON_SSD, **settings)
    try:
        meta = store.meta.store
        assert meta is not None
        claim, complete = meta.claim_moves, meta.complete_moves
        abandoned: list[int] = []
        seen: list[tuple[Tier, ...]] = []  # where a lived right after its move was reported

        def claim_then_read(daemon_id, max_bytes):
            tasks = claim(daemon_id, max_bytes)
            for t in tasks:
                if t.key == "a" and t.kind is MoveKind.DEMOTE and not abandoned:
                    meta.get(["a"], client_id="reader")  # a read lease: the move cannot switch
                    abandoned.append(t.move_id)
            return tasks

        def complete_then_remove(daemon_id, results):
            complete(daemon_id, results)
            if any(r.move_id in abandoned for r in results):
                seen.append(meta.describe(["a"])[0].tiers)
                meta.remove(["a"], force=True)  # gone from DRAM; its SSD copy was never its

        meta.claim_moves, meta.complete_moves = claim_then_read, complete_then_remove  # type: ignore[method-assign]
        with KVClient(store.address) as c:
            c.put("a", block(9, 0, MIB))
            c.put("b", block(9, 1, MIB))
            wait_until(
                lambda: c.describe(["b"])[0].tiers == (Tier.SSD,) and not c.exists("a"),
                what="b demoted, a's move abandoned and a removed",
            )
        assert seen == [(Tier.DRAM,)]  # the move was abandoned, not switched
        if restart == "daemon":
            store.daemon.stop()
            store.add_daemon(**settings)
        else:
            store.close()
            store = InProcessStore(ALL_ON_SSD, **settings)  # knows only the SSD journal
        with KVClient(store.address) as c:
            assert c.get("b") == block(9, 1, MIB)
            assert c.exists("a") is False
    finally:
        store.close()


# -- the parts, as real objects -------------------------------------------------------------------


def test_the_journal_forgets_a_block_and_only_that_block(tmp_path):
    seg = SsdSegment.open(tmp_path, 0, 1 << 20)
    data = block(10, 0, 5000)
    try:
        seg.write_from(0, memoryview(data))
        seg.write_from(8192, memoryview(data))
        a, b = Block("a", 0, len(data), checksum(data)), Block("b", 8192, len(data), checksum(data))
        seg.record_many([a, b])
        seg.forget_many(
            [
                Block("b", 0, len(data), checksum(data)),  # not where b lives: nothing
                Block("a", 0, len(data), checksum(data) ^ 1),  # other bytes than a's: nothing
                b,
            ]
        )
        assert seg.recover().blocks == [a]
        seg.record_many([Block("b", 8192, len(data), checksum(data))])  # b written there again
        assert seg.recover().blocks == [a, b]  # the old deletion ends it no more
    finally:
        seg.close()


BLOCK = 4096


def takeover_store(clock: FakeClock, replicas: dict[str, int]) -> MetaStore:
    """A service taking over a journal in which daemon d1's SSD segment holds `replicas`
    (key -> offset), of BLOCK bytes, checksum 5; writes open."""
    st = MetaStore(MetaConfig(move_timeout_s=10), SIGNER, clock)
    info = segment("ssd", "d1", Tier.SSD, 1 << 20)
    objects = [(k, ObjectRecord(BLOCK, 5, 1, (pack_location(1, off),))) for k, off in replicas.items()]
    st.restore([SegmentRecord(1, info)], objects, [])
    clock.advance(st.takeover_wait_s() + 1)
    st.mount_segment(info)  # d1 is back: confirmed
    return st


def test_a_new_leader_adopts_from_a_journal_only_what_it_loaded():
    clock = FakeClock()
    st = takeover_store(clock, {"kept": 0})
    # d1's journal still names "gone", removed under the old leader, which died before telling d1.
    results = st.announce("ssd", [Block("kept", 0, BLOCK, 5), Block("gone", 8192, BLOCK, 5)])
    assert [r.code for r in results] == [ErrorCode.ALREADY_EXISTS, ErrorCode.KEY_NOT_FOUND]
    assert st.exists(["gone"]) == [False]
    [forget] = st.claim_moves("d1", 1 << 30)  # d1 is told to journal that
    assert (forget.kind, forget.key, forget.dst_segment_id, forget.dst_offset) == (MoveKind.FORGET, "gone", "ssd", 8192)
    st.check_invariants()


def test_a_deletion_not_reported_is_handed_out_again_and_refuses_the_block_meanwhile():
    clock = FakeClock()
    st = takeover_store(clock, {"k": 0})
    assert st.remove(["k"]) == [OK]
    [forget] = st.claim_moves("d1", 1 << 30)
    assert (forget.kind, forget.key) == (MoveKind.FORGET, "k")
    assert st.claim_moves("d1", 1 << 30) == []  # out, not yet reported
    # The daemon restarts before it journaled the deletion: its journal still names the block.
    st.mount_segment(segment("ssd", "d2", Tier.SSD, 1 << 20))
    assert st.announce("ssd", [Block("k", 0, BLOCK, 5)])[0].code is ErrorCode.KEY_NOT_FOUND
    assert st.exists(["k"]) == [False]
    clock.advance(11)  # past move_timeout_s
    [again] = st.claim_moves("d2", 1 << 30)
    assert (again.kind, again.key, again.dst_offset) == (MoveKind.FORGET, "k", 0)
    st.complete_moves("d2", [MoveOutcome(again.move_id, True, "")])
    st.complete_moves("d1", [MoveOutcome(forget.move_id, True, "")])  # late, from the old daemon: ignored
    assert st.claim_moves("d2", 1 << 30) == []
    st.check_invariants()
