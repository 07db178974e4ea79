"""A leader answers only under its lease: past it no reply, no grant, no heartbeat answer (it cannot
tell Redis down from a partition in which a successor was elected); no grant it signs outlives what
a successor keeps out of reach; a load that outlived its election is never served; a new leader
takes writes at once. Real redis-server, real `kvstore meta` processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore import tokens
from kvstore.clock import SystemClock
from kvstore.config import MetaConfig
from kvstore.errors import KVStoreError, Unavailable
from kvstore.grant import GrantSigner
from kvstore.meta.ha import Replicated
from kvstore.meta.leader import Role
from kvstore.meta.store import MetaStore
from kvstore.metaclient.client import MetaClient
from kvstore.wire.calls import Exists, Get, Heartbeat, MatchPrefix, Stats
from tests.cluster import SECRET, Cluster, wait_until
from tests.ha.conftest import FAST, meta_on
from tests.redis_server import RedisServer


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def _answer(call) -> str:
    try:
        call()
        return "ok"
    except Unavailable:
        return "unavailable"
    except KVStoreError as exc:
        return type(exc).__name__


def test_a_leader_cut_off_from_redis_answers_no_read_and_no_heartbeat_past_its_lease(ha: Cluster, redis):
    _, address, _ = meta_on(ha, redis)
    ha.daemon(address, "64MiB", FAST)
    daemon = MetaClient(address, timeout_s=2, token=tokens.daemon_token(SECRET.encode()))
    with MetaClient(address, timeout_s=2) as meta, daemon:
        wait_until(lambda: meta.call(Stats()).writes_open, 30, "writes open")
        assert _answer(lambda: meta.call(Get(["nothing"]))) == "ok"
        redis.kill()  # the leader can no longer renew its lease; a standby elsewhere could lead
        wait_until(lambda: _answer(lambda: meta.call(Get(["nothing"]))) == "unavailable", 30, "reads refused")
        assert _answer(lambda: daemon.call(Heartbeat("d-probe", []))) == "unavailable"
        assert _answer(lambda: meta.call(Exists(["nothing"]))) == "unavailable"
        assert _answer(lambda: meta.call(MatchPrefix(["nothing"]))) == "unavailable"


def test_between_its_lease_end_and_its_step_down_a_leader_answers_nothing(redis):
    """The window a hung Redis opens: the renewal blocks for its socket timeout, the lease ends by
    the leader's own clock meanwhile, and only then does it step down."""
    replicated = _replicated(
        redis, lambda journal, **kw: MetaStore(MetaConfig(), GrantSigner(SECRET.encode()), journal=journal, **kw)
    )
    replicated.start()
    try:
        wait_until(lambda: replicated.current() is not None, 30, "the store loaded")
        leadership = replicated.leadership
        leadership._stop.set()  # freeze the election where it is (a renewal hung on Redis)...
        leadership._thread.join(10)
        assert leadership.view.role is Role.LEADER and replicated.for_reads() is replicated.current()
        leadership._valid_until = 0.0  # ...while the lease ends by the leader's own clock
        leadership.redis_error = "TimeoutError: Redis does not answer"
        with pytest.raises(Unavailable):
            replicated.for_reads()
        with pytest.raises(Unavailable):
            replicated.still_answering()
    finally:
        replicated.stop()


def test_a_store_with_no_earlier_leader_opens_for_writes_at_once(ha: Cluster, redis):
    long_grants = {
        "KVSTORE_META_LEASE_TTL_S": "5",
        "KVSTORE_META_WRITE_GRANT_TTL_S": "30",
        "KVSTORE_META_PUT_LEASE_TTL_S": "30",
    }  # a takeover would wait 32 s
    _, address, _ = meta_on(ha, redis, env=long_grants)
    with MetaClient(address, timeout_s=2) as meta:
        wait_until(
            lambda: _answer(lambda: meta.call(Stats())) == "ok" and meta.call(Stats()).role == "leader", 30, "a leader"
        )
        assert meta.call(Stats()).writes_open  # nobody signed a grant before it: nothing to wait out


def _replicated(redis: RedisServer, make) -> Replicated:
    config = MetaConfig(redis_url=redis.url, leader_ttl_s=2, leader_renew_s=0.3)
    return Replicated(config, GrantSigner(SECRET.encode()), "127.0.0.1:1", SystemClock(), make)


def test_grants_signed_past_the_lease_expire_by_its_end_plus_a_grant_lifetime(redis):
    stores: list[MetaStore] = []

    def make(journal, grant_ceiling):
        stores.append(
            MetaStore(MetaConfig(), GrantSigner(SECRET.encode()), journal=journal, grant_ceiling=grant_ceiling)
        )
        return stores[-1]

    replicated = _replicated(redis, make).start()
    try:
        wait_until(lambda: replicated.current() is not None, 30, "the store loaded")
        lease_end = replicated.leadership.lease_end()
        ceiling = lease_end + max(MetaConfig().lease_ttl_s, MetaConfig().write_grant_ttl_s)
        assert stores[0]._st.grant_ceiling() == pytest.approx(ceiling, abs=0.5)
        redis.kill()  # no renewal: the lease runs out and the ceiling stays where it ended
        wait_until(lambda: not replicated.leadership.leads(), 30, "the lease to run out")
        assert stores[0]._st.grant_ceiling() <= ceiling + 1.0
    finally:
        replicated.stop()


def test_a_load_that_outlived_its_election_is_never_served(redis):
    loading, release = threading.Event(), threading.Event()
    made: list[MetaStore] = []

    class SlowFirstLoad(MetaStore):
        def restore(self, *args, **kwargs):
            if self is made[0]:  # the first election's load stalls until the test lets it go
                loading.set()
                release.wait(30)
            return super().restore(*args, **kwargs)

    def make(journal, grant_ceiling):
        made.append(
            SlowFirstLoad(MetaConfig(), GrantSigner(SECRET.encode()), journal=journal, grant_ceiling=grant_ceiling)
        )
        return made[-1]

    replicated = _replicated(redis, make).start()
    try:
        assert loading.wait(30)
        first = replicated.leadership.view.epoch
        redis.client().delete(replicated.leadership._keys.leader)  # that lease is gone meanwhile
        # It notices, steps down and is elected again at a later epoch, whose load is quick.
        wait_until(lambda: len(made) == 2 and replicated.current() is made[1], 30, "the next epoch's store")
        assert replicated.leadership.view.epoch > first
        release.set()  # the stale load finishes now
        wait_until(lambda: made[0].reconciling >= 0 and not _loading(made[0]), 30, "the stale load to end")
        assert replicated.current() is made[1]
    finally:
        release.set()
        replicated.stop()


def _loading(store: MetaStore) -> bool:
    """Whether the store's restore still holds its lock (the load is not done)."""
    if store._lock.acquire(timeout=0):
        store._lock.release()
        return False
    return True


def test_a_new_leader_takes_puts_at_once(ha: Cluster, redis):
    """A standby that takes over after a kill -9 takes writes as soon as it leads: only the space
    its predecessor's grants can still reach waits (tests/unit/test_takeover_holds.py)."""
    from kvstore.client import KVClient
    from kvstore.config import ClientConfig
    from tests.ha.test_ha import leader_of, writes_open

    a, addr_a, _ = meta_on(ha, redis)
    wait_until(lambda: leader_of(addr_a), 30, "a leader")
    _, addr_b, _ = meta_on(ha, redis)
    both = f"{addr_a},{addr_b}"
    ha.daemon(both, "64MiB", FAST)
    wait_until(lambda: writes_open(addr_a), 30, "writes open")
    with KVClient(both, ClientConfig(timeout_s=30)) as client:
        client.put("before", b"b" * 4096)
        a.kill()
        wait_until(lambda: leader_of(addr_b), 30, "the standby to lead")
        with MetaClient(addr_b, timeout_s=2) as meta:
            assert meta.call(Stats()).writes_open  # nothing to wait out but the space old grants reach
        client.put("after", b"a" * 4096)
        assert client.get("after") == b"a" * 4096 and client.get("before") == b"b" * 4096
