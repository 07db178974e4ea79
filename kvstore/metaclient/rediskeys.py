"""The names of one kvstore cluster's keys in Redis (see kvstore/meta/redisdb.py for what each
holds), and how any process connects: the metadata service for its records and its election,
a client or daemon to find the leader. redis-py is imported only when a Redis URL is used."""

from __future__ import annotations

from typing import Any

from kvstore.errors import Unavailable


class Keys:
    """Every key of one cluster (and shard) shares one hash tag: one Redis Cluster slot."""

    def __init__(self, cluster: str, shard: str = "") -> None:
        tag = "{kvstore:" + cluster + (f":{shard}" if shard else "") + "}"
        self.meta, self.epoch, self.leader, self.members = (
            f"{tag}:{n}" for n in ("meta", "epoch", "leader", "members")
        )
        self.obj, self.seg, self.pin, self.ten, self.hold = (f"{tag}:{n}" for n in ("obj", "seg", "pin", "ten", "hold"))
        # The cluster's shard map (shard count, epoch): under the cluster's own tag, shard 0's.
        self.shards = "{kvstore:" + cluster + "}:shards"

    @staticmethod
    def of_shard(cluster: str, index: int) -> Keys:
        """Shard `index`'s keys: shard 0 keeps the unsharded names, so a store that grows from one
        shard to more keeps its records where they are."""
        return Keys(cluster, str(index) if index else "")


def connect(url: str, timeout_s: float = 2.0) -> Any:
    """A redis-py client for `url` (a Redis Cluster client when the server is in cluster mode);
    Unavailable, naming the URL, when nothing answers there."""
    try:
        import redis
        from redis.cluster import RedisCluster
    except ImportError as exc:
        raise Unavailable(f"metadata on Redis needs redis-py ({exc}): pip install 'kvcachestore[ha]'") from exc
    try:
        client: Any = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        info = client.info("cluster")
        if info.get("cluster_enabled"):
            client.close()
            client = RedisCluster.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        client.ping()
        return client
    except redis.RedisError as exc:
        raise Unavailable(f"Redis at {url} does not answer ({exc}): start it, or fix --redis") from exc
