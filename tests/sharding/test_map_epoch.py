"""The shard map carries a real epoch: a changed map (`kvstore serve --shards` telling every
shard's address; on Redis, a shard electing another leader) carries a larger one, an unchanged
map keeps it, and WRONG_SHARD and ServiceInfo name the map's current epoch."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import WrongShard
from kvstore.meta.leader import Leadership
from kvstore.meta.shardmap import RedisShards, StaticShards
from kvstore.meta.store import MetaStore
from kvstore.metaclient.rediskeys import Keys
from kvstore.server.auth import OPERATOR
from kvstore.server.handlers import MetaHandlers
from kvstore.shards import ShardSpec, shard_of
from kvstore.v1 import meta_pb2 as pb
from tests.meta_helpers import SIGNER
from tests.redis_server import RedisServer

WAIT_S = 30  # a safety net, never a threshold


def _refused_epoch(handlers: MetaHandlers) -> int:
    """The epoch a WRONG_SHARD answer of shard 0 of 2 names."""
    stray = next(k for k in (f"k/{i}" for i in range(100)) if shard_of(k, 2) == 1)
    with pytest.raises(WrongShard) as refused:
        handlers.handler("Exists")(pb.ExistsRequest(keys=[stray]), OPERATOR)
    return refused.value.map_epoch


def _info_epoch(handlers: MetaHandlers) -> int:
    return handlers.handler("ServiceInfo")(pb.ServiceInfoRequest(), OPERATOR).map_epoch


def test_a_static_map_that_changes_carries_a_larger_epoch_and_wrong_shard_names_it():
    shards = StaticShards(ShardSpec(0, 2), "", "127.0.0.1:1")
    handlers = MetaHandlers(MetaStore(MetaConfig(), SIGNER), shard=ShardSpec(0, 2), shards=shards)
    before = shards.current().epoch
    assert _refused_epoch(handlers) == _info_epoch(handlers) == before

    shards.update(["127.0.0.1:1", "127.0.0.1:2"])  # `kvstore serve --shards` tells every address
    told = shards.current()
    assert told.addresses == ("127.0.0.1:1", "127.0.0.1:2") and told.epoch > before
    assert _refused_epoch(handlers) == _info_epoch(handlers) == told.epoch

    shards.update(["127.0.0.1:1", "127.0.0.1:2"])  # the same map: the same epoch
    assert shards.current().epoch == told.epoch
    shards.update(["127.0.0.1:1", "127.0.0.1:3"])  # shard 1 moved
    assert shards.current().epoch > told.epoch
    assert _refused_epoch(handlers) == shards.current().epoch


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def _lead(redis: RedisServer, shard: int, address: str) -> Leadership:
    """A real election for `shard`, won by `address` (waited for by its on_elected call)."""
    elected = threading.Event()
    leadership = Leadership(redis.client(), Keys.of_shard("default", shard), address, 5.0, 0.2,
                            lambda epoch, token: elected.set(), lambda: None).start()  # fmt: skip
    assert elected.wait(WAIT_S), f"{address} was not elected for shard {shard}"
    return leadership


def test_a_redis_map_whose_leader_changes_carries_a_larger_epoch_and_wrong_shard_names_it(redis):
    clock = FakeClock()
    shards = RedisShards(redis.client(), "default", ShardSpec(0, 2), clock)
    handlers = MetaHandlers(MetaStore(MetaConfig(), SIGNER), shard=ShardSpec(0, 2), shards=shards)
    leaders = [_lead(redis, 0, "127.0.0.1:10"), _lead(redis, 1, "127.0.0.1:11")]
    try:
        first = shards.current()
        assert first.addresses == ("127.0.0.1:10", "127.0.0.1:11")
        assert _refused_epoch(handlers) == _info_epoch(handlers) == first.epoch

        clock.advance(5)  # past the directory's cache: it reads Redis again, and nothing changed
        assert shards.current() == first

        leaders[1].stop()  # shard 1's leader goes; another service is elected in its place
        leaders[1] = _lead(redis, 1, "127.0.0.1:21")
        clock.advance(5)
        second = shards.current()
        assert second.addresses == ("127.0.0.1:10", "127.0.0.1:21") and second.epoch > first.epoch
        assert _refused_epoch(handlers) == _info_epoch(handlers) == second.epoch
    finally:
        for leadership in leaders:
            leadership.stop()
