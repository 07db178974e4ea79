"""Records a service cannot decode (a garbage object, segment, pin or tenant record, a key that is
not UTF-8) are skipped, logged and counted in the restore report; the service still becomes the
leader and serves every good record. Real redis-server, in-process Replicated services."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.clock import SystemClock
from kvstore.config import MetaConfig
from kvstore.meta.ha import Replicated
from kvstore.meta.recovery import Restored
from kvstore.meta.store import MetaStore
from kvstore.metaclient.rediskeys import Keys
from kvstore.types import Tier
from tests.cluster import wait_until
from tests.meta_helpers import SIGNER, commit, segment
from tests.redis_server import RedisServer

WAIT_S = 30  # a safety net, never a threshold: each wait ends on a signal


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


class Takeover:
    """An in-process service on `redis` whose load is watched: `done` is set when its restore
    returned (the report in `reports`) or the takeover failed (logged by the election)."""

    def __init__(self, redis: RedisServer) -> None:
        self.done = threading.Event()
        self.reports: list[Restored] = []
        self.stores: list[MetaStore] = []
        watch = self

        class Watched(MetaStore):
            def restore(self, *args, **kwargs):
                try:
                    watch.reports.append(super().restore(*args, **kwargs))
                finally:
                    watch.done.set()
                return watch.reports[-1]

        def make(journal, grant_ceiling):
            self.stores.append(Watched(MetaConfig(), SIGNER, journal=journal, grant_ceiling=grant_ceiling))
            return self.stores[-1]

        config = MetaConfig(redis_url=redis.url, leader_ttl_s=2, leader_renew_s=0.3)
        self.service = Replicated(config, SIGNER, "127.0.0.1:1", SystemClock(), make)

    def __enter__(self) -> Takeover:
        handler = _OnError(self.done)
        logging.getLogger("kvstore.meta.leader").addHandler(handler)
        self._handler = handler
        self.service.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.service.stop()
        logging.getLogger("kvstore.meta.leader").removeHandler(self._handler)

    def leader(self) -> MetaStore:
        assert self.done.wait(WAIT_S), "the service neither loaded its records nor failed to"
        assert self.reports, "the takeover failed: the records could not be loaded"
        store = wait_until(self.service.current, WAIT_S, "the loaded store to serve")
        assert self.service.for_reads() is store
        return store


class _OnError(logging.Handler):
    """Sets `event` when the election logs a failed takeover."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.ERROR)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


def test_a_service_leads_and_serves_the_good_records_past_unreadable_ones(redis, caplog):
    with Takeover(redis) as first:
        store = first.leader()
        store.mount_segment(segment("s1", "d1", Tier.DRAM, 1 << 20))
        keys = [f"good/{i}" for i in range(3)]
        commit(store, keys, store.put_start(keys, [100, 200, 300]).results)
        store.pin(["good/0"], 3600)
    client, k = redis.client(), Keys("default")
    client.hset(k.obj, "bad/short", b"\x01garbage")  # too short for a record
    client.hset(k.obj, "bad/ragged", b"\x00" * 17 + b"\x01\x02")  # a partial location
    client.hset(k.obj, b"\xff\xfe-not-utf8", client.hget(k.obj, "good/1"))  # a key that is not text
    client.hset(k.seg, "bad-seg", b"\x00\x00\x00\x07\xff\xff\xff")  # not a Segment message
    client.hset(k.pin, "good/1", b"not-a-deadline")
    client.hset(k.ten, "bad-tenant", b"{not json")

    with caplog.at_level(logging.WARNING), Takeover(redis) as second:
        store = second.leader()
        [report] = second.reports
        assert report.unreadable == 6 and report.objects == 3 and report.segments == 1
        assert store.exists(["good/0", "good/1", "good/2", "bad/short"]) == [True, True, True, False]
        assert [i.size for i in store.describe(["good/0", "good/1", "good/2"])] == [100, 200, 300]
        assert store.describe(["good/0"])[0].pin_s > 0
    logged = caplog.text
    for name in ("bad/short", "bad/ragged", "bad-seg", "bad-tenant", "good/1"):
        assert name in logged, f"the skipped record {name!r} is not named in the log"
