"""Durable, highly available metadata on a real redis-server: nothing committed is lost when the
metadata service dies, a standby takes over by itself, a paused leader is fenced, and Redis
failures are typed."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from typing import Any

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KVStoreError, NotLeader, Unavailable
from kvstore.metaclient.channel import MetaChannel
from kvstore.metaclient.client import MetaClient
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire.calls import ServiceInfo, Stats, TenantAdd, TenantRevoke, TenantToken
from tests.cluster import ADMIN_TOKEN, spawn, wait_until
from tests.ha.conftest import FAST, meta_on


def value(key: str) -> bytes:
    seed = key.encode()
    return (seed * (8192 // len(seed) + 1))[:8192]


def leader_of(*addresses: str) -> str | None:
    for address in addresses:
        try:
            with MetaClient(address, timeout_s=1) as meta:
                info = meta.call(ServiceInfo())
            if info.role == "leader":
                return address
        except KVStoreError:
            continue
    return None


def writes_open(address: str) -> bool:
    try:
        with MetaClient(address, timeout_s=1) as meta:
            stats = meta.call(Stats())
        return stats.writes_open and stats.reconciling == 0
    except KVStoreError:
        return False


class PutStream:
    """A client putting batches of distinct keys in its own thread until stop(): the keys
    acknowledged and those whose put failed (it then backs off a little, as an engine would)."""

    def __init__(self, address: str, prefix: str, batch: int) -> None:
        self.acked: list[str] = []
        self.failed: list[str] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(address, prefix, batch))
        self._thread.start()

    def _run(self, address: str, prefix: str, batch: int) -> None:
        with KVClient(address, ClientConfig(timeout_s=5)) as client:
            n = 0
            while not self._stopping.is_set():
                keys = [f"{prefix}/{n}/{i}" for i in range(batch)]
                n += 1
                try:
                    client.put_many(keys, [value(k) for k in keys])
                    self.acked.extend(keys)
                except KVStoreError:
                    self.failed.extend(keys)
                    self._stopping.wait(0.05)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(30)


def invariants(admin: str) -> dict[str, Any]:
    """/debug/invariants, the operator's call (an O(N) walk under the store's lock)."""
    request = urllib.request.Request(
        f"http://{admin}/debug/invariants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def test_a_restarted_service_recovers_every_committed_key_of_live_daemons(ha, redis):
    proc, address, _ = meta_on(ha, redis, "--port", "0")
    port = address.rsplit(":", 1)[1]
    for _ in range(2):
        ha.daemon(address, "64MiB", FAST)
    keys = [f"r/{i}" for i in range(100)]
    with KVClient(address) as client:
        wait_until(lambda: writes_open(address), timeout=30, what="the first leader to open")
        client.put_many(keys, [value(k) for k in keys])
    proc.kill()  # kill -9, no standby
    _, _, admin = meta_on(ha, redis, "--port", port)  # the same Redis, the same address
    wait_until(lambda: writes_open(address), timeout=60, what="the restarted service to reconcile")
    with KVClient(address) as client:
        assert client.get_many(keys) == [value(k) for k in keys]  # 100 % of the committed keys
        client.put("after", b"a")
        assert client.get("after") == b"a"
    assert invariants(admin)["ok"] is True


def test_kill9_of_the_leader_in_a_put_stream_loses_no_acknowledged_put(ha, redis):
    a, addr_a, _ = meta_on(ha, redis)
    wait_until(lambda: leader_of(addr_a), timeout=30, what="a leader")
    _b, addr_b, admin_b = meta_on(ha, redis)
    both = f"{addr_a},{addr_b}"
    for _ in range(2):
        ha.daemon(both, "64MiB", FAST)
    wait_until(lambda: writes_open(addr_a), timeout=30, what="writes open")
    stream = PutStream(both, "s", 8)
    acked, failed = stream.acked, stream.failed
    wait_until(lambda: len(acked) >= 200, timeout=60, what="puts before the kill")
    killed_at = time.monotonic()
    a.kill()
    before = len(acked)
    wait_until(lambda: len(acked) > before + 8, timeout=60, what="a put after the failover")
    failover_s = time.monotonic() - killed_at
    wait_until(lambda: len(acked) > before + 200, timeout=60, what="the stream going on")
    stream.stop()
    # Writes open at once; a daemon's replicas are read once it has mounted its segments again.
    wait_until(lambda: writes_open(addr_b), timeout=60, what="every daemon to mount its segments again")
    with KVClient(addr_b) as client:
        assert client.get_many(acked) == [value(k) for k in acked]  # every acknowledged put
        for start in range(0, len(failed), 1000):
            part = failed[start : start + 1000]
            for _key, got in zip(part, client.get_many_into(part, [bytearray(8192) for _ in part], strict=False)):
                if isinstance(got, int):  # a put that failed late: whole
                    assert got == 8192
                else:
                    assert isinstance(got, KVStoreError)  # or absent; never half-visible
    assert invariants(admin_b)["ok"] is True
    print(f"failover: first acknowledged put {failover_s:.2f} s after the leader died (lease TTL 2 s)")


def test_a_paused_leader_is_fenced_and_steps_down(ha, redis):
    a, addr_a, _ = meta_on(ha, redis)
    wait_until(lambda: leader_of(addr_a), timeout=30, what="a leader")
    _, addr_b, _ = meta_on(ha, redis)
    both = f"{addr_a},{addr_b}"
    ha.daemon(both, "64MiB", FAST)
    wait_until(lambda: writes_open(addr_a), timeout=30, what="writes open")
    with KVClient(both) as client:
        client.put("before", b"b" * 100)
    os.kill(a.pid, signal.SIGSTOP)  # past its lease
    try:
        wait_until(lambda: leader_of(addr_b) == addr_b, timeout=30, what="the standby to take over")
        wait_until(lambda: writes_open(addr_b), timeout=60, what="the new leader to open")
        with KVClient(addr_b) as client:
            client.put("during", b"d" * 100)
    finally:
        os.kill(a.pid, signal.SIGCONT)
    old = MetaChannel(addr_a, 5.0, token=ADMIN_TOKEN)  # the old leader itself, no redirection
    try:
        with pytest.raises((NotLeader, Unavailable)):  # it cannot change anything
            old.call("PutStart", pb.PutStartRequest(keys=["from-old"], sizes=[10], replica_num=1))
        wait_until(lambda: _role(old) == "standby", timeout=30, what="the old leader to step down")
        with pytest.raises(NotLeader) as refusal:
            old.call("Exists", pb.ExistsRequest(keys=["before"]))
        assert refusal.value.leader == addr_b
    finally:
        old.close()
    with KVClient(both) as client:  # clients follow to the leader
        assert client.get("before") == b"b" * 100 and client.get("during") == b"d" * 100
        assert client.exists("from-old") is False


def _role(channel: MetaChannel) -> str:
    return channel.call("ServiceInfo", pb.ServiceInfoRequest()).role


def test_redis_down_at_start_is_refused_naming_the_url(redis):
    redis.stop()
    with pytest.raises(RuntimeError) as failed:
        spawn(["meta", "--port", "0"], {**FAST, "KVSTORE_META_REDIS_URL": redis.url}, timeout=30)
    assert redis.url.split("/0")[0].split("//")[1] in str(failed.value) and "Traceback" not in str(failed.value)


def test_redis_lost_while_serving_fails_writes_typed_and_reads_within_the_lease(ha, redis):
    _, address, _ = meta_on(ha, redis)
    ha.daemon(address, "64MiB", FAST)
    wait_until(lambda: writes_open(address), timeout=30, what="writes open")
    with KVClient(address, ClientConfig(timeout_s=3)) as client:
        client.put("kept", b"k" * 100)
        redis.kill()
        with pytest.raises(Unavailable):
            client.put("during", b"d" * 100)
        try:  # reads go on while its lease lasts by its own clock; past it, nothing is answered
            assert client.get("kept") == b"k" * 100
        except Unavailable:
            pass
        redis.start()  # its AOF comes back with it
        wait_until(lambda: _put(client, "after", b"a" * 100), timeout=60, what="writes back by themselves")
        assert client.get("kept") == b"k" * 100 and client.get("after") == b"a" * 100
        assert client.exists("during") is False  # never acknowledged, not kept


def _put(client: KVClient, key: str, data: bytes) -> bool:
    try:
        client.put(key, data)
        return True
    except KVStoreError:
        return False


def test_another_schemas_records_are_refused(redis):
    r = redis.client()
    r.hset("{kvstore:default}:meta", mapping={"schema": "kvstore-meta-0", "cluster": "default"})
    with pytest.raises(RuntimeError) as failed:
        spawn(["meta", "--port", "0"], {**FAST, "KVSTORE_META_REDIS_URL": redis.url}, timeout=30)
    assert "schema" in str(failed.value) and "Traceback" not in str(failed.value)
    # another cluster on the same Redis has keys of its own
    proc = spawn(
        ["meta", "--port", "0"],
        {**FAST, "KVSTORE_META_REDIS_URL": redis.url, "KVSTORE_META_CLUSTER": "other"},
        timeout=30,
    )
    proc.stop()


def test_a_32_key_put_end_is_one_redis_round_trip(ha, redis):
    quiet = {"KVSTORE_META_LEADER_TTL_S": "60", "KVSTORE_META_LEADER_RENEW_S": "20"}  # few renewals meanwhile
    _, address, _ = meta_on(ha, redis, env=quiet)
    ha.daemon(address, "64MiB", FAST)
    wait_until(lambda: writes_open(address), timeout=30, what="writes open")
    with KVClient(address) as client:
        client.put("warm", b"w")
        before = redis.script_calls()
        client.put_many([f"b/{i}" for i in range(32)], [value(f"b/{i}") for i in range(32)])
        # The region's hold, its commits (the client sends them in at most two calls) and a lease
        # renewal at most: never a write per key.
        assert redis.script_calls() - before <= 4


def test_the_cli_runs_a_pair_on_redis_and_stat_shows_the_election(ha, redis):
    env = {"KVSTORE_META_REDIS_URL": "", "KVSTORE_META_ADMIN_PORT": "-1"}  # the flags alone
    _first, a, _ = meta_on(ha, redis, "--redis", redis.url, "--cluster", "cli", env=env)
    _second, b, _ = meta_on(ha, redis, "--redis", redis.url, "--cluster", "cli", env=env)
    leader = wait_until(lambda: leader_of(a, b), what="a leader")
    standby = b if leader == a else a
    wait_until(lambda: standby in _stat(leader), what="the standby listed")
    said = _stat(leader)
    assert "service leader, epoch " in said and f"leader {leader}" in said and "redis ok" in said, said
    assert "service standby" in _stat(standby)


def _stat(address: str) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kvstore", "stat", "--meta", address],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, KVSTORE_SECRET="x"),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_tenants_and_their_tokens_survive_a_restart_on_redis(ha, redis):
    from kvstore.config import ClientConfig
    from kvstore.errors import Unauthenticated
    from kvstore.results import TenantInfo
    from kvstore.types import Tier

    proc, address, _ = meta_on(ha, redis, "--port", "0")
    port = address.rsplit(":", 1)[1]
    ha.daemon(address, "64MiB", FAST)
    wait_until(lambda: writes_open(address), timeout=30, what="the first leader to open")
    with MetaClient(address) as admin:
        admin.call(TenantAdd(TenantInfo("kept", quotas={Tier.DRAM: 1 << 20})))
        admin.call(TenantAdd(TenantInfo("dropped")))
        _, kept = admin.call(TenantToken("kept"))
        _, dropped = admin.call(TenantToken("dropped"))
        admin.call(TenantRevoke("dropped"))
    with KVClient(address, ClientConfig(token=kept)) as client:
        client.put("mine", b"tenant bytes")
    proc.kill()
    meta_on(ha, redis, "--port", port)
    wait_until(lambda: writes_open(address), timeout=60, what="the restarted service to reconcile")
    with KVClient(address, ClientConfig(token=kept)) as client:
        assert client.get("mine") == b"tenant bytes"
        assert client.stats().tiers[0].capacity == 1 << 20  # its quota came back too
    with KVClient(address) as operator:
        assert operator.exists_many(["mine"]) == [False]  # still in its own namespace
    with pytest.raises(Unauthenticated), KVClient(address, ClientConfig(token=dropped)) as client:
        client.exists_many(["mine"])
