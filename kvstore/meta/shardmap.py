"""Where a sharded metadata service finds the other shards, to answer ServiceInfo with the map.

On Redis the map is the cluster's `shards` record (shard count and map epoch, claimed by the
first shard to start, checked by every other) and each shard's leader key. In memory it is the
`shard_map` setting: every shard's address by index (`kvstore serve --shards S` writes it).

The map's epoch grows whenever the map changes, so a client can tell a newer map from its own
(WRONG_SHARD names it). In memory: each update that changes an address. On Redis it is computed
from what every service reads alike: the `shards` record's epoch plus every shard's election
epoch, which each new leader increments and writes with its address (a shard whose leader's
lease lapsed shows no address, and its last epoch, until the next election moves it: clients
route by no map with a hole).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kvstore.clock import Clock, SystemClock
from kvstore.config import MetaConfig
from kvstore.errors import InvalidArgument, Unavailable
from kvstore.metaclient.rediskeys import Keys
from kvstore.shards import ShardMap, ShardSpec

log = logging.getLogger(__name__)
_CACHE_S = 1.0


class StaticShards:
    """The map from configuration, or told by `kvstore serve --shards` once every shard is up
    (in memory, the shard count never changes while the services run)."""

    def __init__(self, spec: ShardSpec, addresses: str, own: str) -> None:
        listed = [a.strip() for a in addresses.split(",")] if addresses else []
        if spec.count > 1 and listed and len(listed) != spec.count:
            raise InvalidArgument(f"shard_map names {len(listed)} shards, but this is shard {spec}")
        if listed:
            listed[spec.index] = listed[spec.index] or own
        self.map = ShardMap(tuple(listed), 1 if listed else 0)
        self._lock = threading.Lock()

    def current(self) -> ShardMap:
        return self.map

    def update(self, addresses: list[str]) -> None:
        """Every shard's address, once all are up (`kvstore serve --shards`): a map that differs
        from the one held comes with the next epoch."""
        with self._lock:
            if tuple(addresses) != self.map.addresses:
                self.map = ShardMap(tuple(addresses), self.map.epoch + 1)


class RedisShards:
    """The map in Redis: the count is claimed (or checked) at start; leaders and their election
    epochs are read, at most once a second, when a client asks."""

    def __init__(self, client: Any, cluster: str, spec: ShardSpec, clock: Clock | None = None) -> None:
        self._client = client
        self._cluster = cluster
        self._spec = spec
        self._clock = clock or SystemClock()
        key = Keys(cluster).shards
        client.hsetnx(key, "count", spec.count)
        client.hsetnx(key, "epoch", 0)
        found = int(client.hget(key, "count"))
        if found != spec.count:
            raise InvalidArgument(
                f"Redis says cluster {cluster!r} has {found} shards, not {spec.count}: start every shard with "
                f"--shard I/{found}, or reshard first (kvstore reshard, docs/sharding.md)"
            )
        self._cached: tuple[float, ShardMap] | None = None
        self._lock = threading.Lock()

    def current(self) -> ShardMap:
        with self._lock:
            if self._cached is not None and self._clock.monotonic() - self._cached[0] < _CACHE_S:
                return self._cached[1]
        try:
            epoch = int(self._client.hget(Keys(self._cluster).shards, "epoch") or 0)
            leaders = []
            for i in range(self._spec.count):
                keys = Keys.of_shard(self._cluster, i)
                # Address and election epoch in one read: the election writes them together.
                addr, elected = self._client.hmget(keys.leader, ["addr", "epoch"])
                leaders.append(addr.decode() if addr else "")
                epoch += int((elected if addr else self._client.get(keys.epoch)) or 0)
        except Exception as exc:  # Redis down: the last map read, else a typed error
            with self._lock:
                if self._cached is not None:
                    return self._cached[1]
            raise Unavailable(f"the shard map is in Redis, which does not answer ({exc}): retry") from exc
        shard_map = ShardMap(tuple(leaders), epoch)
        with self._lock:
            self._cached = (self._clock.monotonic(), shard_map)
        return shard_map


def directory(config: MetaConfig, own: str, redis_client: Any | None) -> StaticShards | RedisShards:
    spec = ShardSpec.parse(config.shard)
    if redis_client is not None:
        return RedisShards(redis_client, config.cluster, spec)
    return StaticShards(spec, config.shard_map, own)
