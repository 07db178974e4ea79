"""The DRAM + SSD tier stack across real processes: nothing lost under pressure, readers safe
during demotion, SSD contents surviving a daemon restart."""

import threading

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KVStoreError
from kvstore.wire.calls import Get
from tests.cluster import wait_until
from tests.meta_helpers import endpoint_address
from tests.workers import block

FAST = {
    "KVSTORE_META_TICK_INTERVAL_S": "0.05",
    "KVSTORE_META_HIGH_WATERMARK": "0.8",
    "KVSTORE_META_LOW_WATERMARK": "0.6",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000",
    "KVSTORE_META_SSD_HIGH_WATERMARK": "0.9",
    "KVSTORE_META_SSD_LOW_WATERMARK": "0.8",
}
MIB = 1 << 20


def tier_stats(client):
    return {t.tier.value: t for t in client.stats().tiers}


def settled(client) -> bool:
    """Both tiers at or below their high watermarks: no demotion or SSD deletion is left to run."""
    s = tier_stats(client)
    return s["dram"].used <= 0.8 * s["dram"].capacity and s["ssd"].used <= 0.9 * s["ssd"].capacity


def start(cluster, tmp_path, dram="32MiB", ssd="256MiB", env=None):
    _, address = cluster.meta(dict(FAST, **(env or {})))
    daemon = cluster.daemon(
        address, dram, None, "--segment-size", dram, "--ssd-dir", str(tmp_path / "ssd"), "--ssd", ssd
    )
    return address, daemon


def test_three_times_dram_stays_readable(cluster, tmp_path):
    address, _ = start(cluster, tmp_path)
    keys = [f"t/{i}" for i in range(96)]
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        for i, k in enumerate(keys):  # 96 MiB through 32 MiB of DRAM
            c.put(k, block(1, i, MIB - 1000 + i))
        for i, k in enumerate(keys):
            assert c.get(k) == block(1, i, MIB - 1000 + i), k
        stats = tier_stats(c)
        assert stats["ssd"].demotions >= 64 and stats["ssd"].blocks + stats["dram"].blocks == 96
        assert c.stats().evictions == 0


def test_full_ssd_deletes_only_least_recently_used(cluster, tmp_path):
    address, _ = start(cluster, tmp_path, dram="16MiB", ssd="64MiB")
    n = 160  # 160 MiB through 16 + 64 MiB
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        for i in range(n):
            c.put(f"f/{i}", block(2, i, MIB))
        wait_until(lambda: settled(c), what="tiers below their watermarks")
        alive = c.exists_many([f"f/{i}" for i in range(n)])
        stats = c.stats()
        assert stats.keys + stats.evictions == n  # every block is stored or was evicted
        first_alive = alive.index(True)
        assert not any(alive[:first_alive]) and all(alive[first_alive:])  # a clean LRU cut
        for i in range(first_alive, n):
            assert c.get(f"f/{i}") == block(2, i, MIB)


def test_ssd_admitting_reused_blocks_only_drops_the_unread_ones(cluster, tmp_path):
    address, _ = start(cluster, tmp_path, dram="16MiB", ssd="64MiB", env={"KVSTORE_META_ADMISSION": "ssd=reused"})
    n = 40  # 40 MiB through 16 MiB of DRAM; every other block read right after its put
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        for i in range(n):
            c.put(f"a/{i}", block(5, i, MIB))
            if i % 2 == 0:
                assert c.get(f"a/{i}") == block(5, i, MIB)
        wait_until(lambda: settled(c), what="DRAM below its high watermark")
        alive = c.exists_many([f"a/{i}" for i in range(n)])
        gone = [i for i in range(n) if not alive[i]]
        assert gone and all(i % 2 for i in gone)  # only blocks never read left the store
        assert c.stats().evictions == len(gone) and tier_stats(c)["ssd"].demotions > 0
        for i in range(0, n, 2):
            assert c.get(f"a/{i}") == block(5, i, MIB)  # demoted to SSD, not lost


def test_readers_during_demotion_see_no_wrong_byte_or_miss(cluster, tmp_path):
    address, _ = start(cluster, tmp_path)
    hot = [f"hot/{i}" for i in range(8)]
    values = [block(3, i, 512 * 1024) for i in range(8)]
    failures, stop = [], threading.Event()
    with KVClient(address) as c:
        c.put_many(hot, values)

    def reader(transport: str) -> None:
        with KVClient(address, ClientConfig(transports=(transport,))) as r:
            while not stop.is_set():
                try:
                    if r.get_many(hot) != values:
                        failures.append("wrong bytes")
                except KVStoreError as exc:
                    failures.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(t,)) for t in ("shm", "tcp")]
    for t in threads:
        t.start()
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        for i in range(120):  # forces continual demotion around the readers
            c.put(f"cold/{i}", block(4, i, MIB))
        wait_until(lambda: tier_stats(c)["ssd"].demotions >= 60, what="demotions")
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[:5]


def test_ssd_blocks_survive_daemon_restart_and_corruption_is_dropped(cluster, tmp_path):
    address, daemon = start(cluster, tmp_path, env={"KVSTORE_META_HEARTBEAT_TTL_S": "60"})
    keys = [f"p/{i}" for i in range(40)]
    with KVClient(address, ClientConfig(timeout_s=60)) as c:
        for i, k in enumerate(keys):
            c.put(k, block(5, i, MIB))
        # DRAM settles anywhere below its high watermark (up to 25 of these blocks, depending on
        # when the meta's tick lands), so only 40 - 25 = 15 blocks are sure to reach SSD.
        wait_until(lambda: tier_stats(c)["ssd"].blocks >= 10, what="blocks on SSD")
        reply = c.meta.call(Get(keys))
        segments = reply.segments
        on_ssd = [
            (k, r.grants[0])
            for k, r in zip(keys, reply.results)
            if segments[r.grants[0].segment_id].tier.value == "ssd"
        ]
    victim, grant = on_ssd[0]
    daemon.kill()
    data_file = endpoint_address(segments[grant.segment_id], "shm").split("|")[-1]
    with open(data_file, "r+b") as fh:  # corrupt one block on disk while it is down
        fh.seek(grant.offset + 10)
        fh.write(b"\xde\xad\xbe\xef")

    restarted = cluster.daemon(
        address, "32MiB", None, "--segment-size", "32MiB", "--ssd-dir", str(tmp_path / "ssd"), "--ssd", "256MiB"
    )
    with KVClient(address) as c:
        survivors = [k for k, _ in on_ssd[1:]]
        assert c.exists_many(survivors) == [True] * len(survivors)
        for k in survivors:
            assert c.get(k) == block(5, keys.index(k), MIB)
        assert c.exists(victim) is False  # detected and dropped, never served
    assert any("checksum mismatch" in line and victim in line for line in restarted.lines)
