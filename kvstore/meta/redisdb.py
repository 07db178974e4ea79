"""The metadata service's records in Redis: one set of keys per cluster (and shard), under one
hash tag, so every key of a service lives in one Redis Cluster slot and one Lua script can
check the writer's epoch and apply its whole batch atomically.

    {kvstore:CLUSTER}:meta     hash: schema, cluster (checked at start: another cluster's or
                               another schema's records are refused)
    {kvstore:CLUSTER}:epoch    the fencing epoch: incremented by every leader that takes over
    {kvstore:CLUSTER}:leader   hash: addr, epoch, token; expires with the leader's lease
    {kvstore:CLUSTER}:members  hash: service address -> role and last-seen time (for `stat`)
    {kvstore:CLUSTER}:obj      hash: key -> object record (kvstore.meta.records)
    {kvstore:CLUSTER}:seg      hash: segment id -> segment record
    {kvstore:CLUSTER}:pin      hash: key -> pin deadline
    {kvstore:CLUSTER}:ten      hash: tenant name -> tenant record (kvstore.meta.tenants: ids,
                               quotas, SHA-256 of its tokens)
    {kvstore:CLUSTER}:hold     hash: location -> bytes held there outside any object (holds.py)

A write is refused whole (FENCED) unless its epoch is the current one and the leader key holds
the writer's lease token (random for every acquisition): a deposed or paused leader can never
change the records, not even when an asynchronous Redis failover lost the epoch's INCR and a
successor was handed the same epoch number again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from kvstore.errors import InvalidArgument, Unavailable
from kvstore.meta.holds import HoldRecord, decode_hold
from kvstore.meta.journal import Changes
from kvstore.meta.records import ObjectRecord, SegmentRecord, Unreadable, decode_object, decode_pin, decode_segment
from kvstore.metaclient.rediskeys import Keys, connect

__all__ = ["SCHEMA", "Keys", "RedisRecords", "check_schema", "connect"]
log = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA = "kvstore-meta-1"

_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('FENCED: epoch ' .. ARGV[1] .. ' is not the leader epoch')
end
if redis.call('HGET', KEYS[6], 'token') ~= ARGV[2] then
  return redis.error_reply('FENCED: the writer does not hold the leader lease')
end
local tables = {o = KEYS[2], s = KEYS[3], p = KEYS[4], t = KEYS[5], h = KEYS[7]}
local i = 3
while i <= #ARGV do
  local op = ARGV[i]
  local key = tables[string.lower(op)]
  if op == 'o' or op == 's' or op == 'p' or op == 't' or op == 'h' then
    redis.call('HSET', key, ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  else
    redis.call('HDEL', key, ARGV[i + 1])
    i = i + 2
  end
end
return 1
"""


def check_schema(client: Any, keys: Keys, cluster: str) -> None:
    """Claim the keys for this cluster and schema, or refuse records written by another."""
    client.hsetnx(keys.meta, "schema", SCHEMA)
    client.hsetnx(keys.meta, "cluster", cluster)
    found = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}
    if found.get("schema") != SCHEMA:
        raise InvalidArgument(
            f"Redis holds kvstore metadata of schema {found.get('schema')!r}, not {SCHEMA!r}: use another Redis "
            "database (or --cluster name), or migrate it"
        )
    if found.get("cluster") != cluster:
        raise InvalidArgument(f"Redis holds the metadata of cluster {found.get('cluster')!r}, not {cluster!r}")


class RedisRecords:
    """Loads and writes one service's records; the writer is fenced by its epoch."""

    def __init__(self, client: Any, keys: Keys, durability: str = "everysec") -> None:
        self.client = client
        self.keys = keys
        self.durability = durability
        self._write = client.register_script(_WRITE)

    # The loaders never raise on a record: one that does not decode comes back as Unreadable, in
    # its place, for the restore to skip, log and count (recovery.py).

    def load_segments(self) -> list[SegmentRecord | Unreadable]:
        return [_decoded("seg", k, v, _segment) for k, v in self._scan(self.keys.seg)]

    def load_objects(self) -> Iterator[tuple[str, ObjectRecord] | Unreadable]:
        for k, v in self._scan(self.keys.obj):
            yield _decoded("obj", k, v, _object)

    def load_pins(self) -> list[tuple[str, float] | Unreadable]:
        return [_decoded("pin", k, v, _pin) for k, v in self._scan(self.keys.pin)]

    def load_tenants(self) -> dict[str, bytes]:
        """Name -> record, decoded by the restore (which skips a record it cannot read); a name
        that is not UTF-8 comes escaped, and is refused there as no tenant's name."""
        return {k.decode("utf-8", "backslashreplace"): v for k, v in self._scan(self.keys.ten)}

    def load_holds(self) -> list[HoldRecord | Unreadable]:
        return [_decoded("hold", k, v, decode_hold) for k, v in self._scan(self.keys.hold)]

    def _scan(self, key: str) -> Iterator[tuple[bytes, bytes]]:
        cursor = 0
        while True:
            cursor, chunk = self.client.hscan(key, cursor, count=5000)
            yield from chunk.items()
            if cursor == 0:
                return

    def writer(self, epoch: int, token: str) -> Any:
        """write(changes) for a journal: one script call fenced by `epoch` and the lease `token`
        (plus WAIT for replicas, with durability "replicas:N"), raising on FENCED or on Redis failing."""
        keys = [self.keys.epoch, self.keys.obj, self.keys.seg, self.keys.pin, self.keys.ten, self.keys.leader]
        keys.append(self.keys.hold)
        replicas = int(self.durability.split(":", 1)[1]) if self.durability.startswith("replicas:") else 0

        def write(changes: Changes) -> None:
            args: list[Any] = [str(epoch), token]
            tables = (
                ("o", changes.objects),
                ("s", changes.segments),
                ("p", changes.pins),
                ("t", changes.tenants),
                ("h", changes.holds),
            )
            for op, table in tables:
                for field, value in table.items():
                    args += [op, field, value] if value is not None else [op.upper(), field]
            if not replicas:
                self._write(keys=keys, args=args)
                return
            # WAIT counts the replicas that have this connection's writes: the script and its
            # WAIT go down one connection, to the master of the records' slot on a Redis Cluster.
            pipe = _node_of(self.client, keys[0]).pipeline(transaction=False)
            self._write(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", replicas, 1000)
            try:
                acked = int(pipe.execute()[-1])
            except Exception:
                _refresh_slots(self.client)  # a failover moved the slot: route the next write anew
                raise
            if acked < replicas:
                raise Unavailable(f"only {acked} of {replicas} Redis replicas acknowledged the write")

        return write

    def durability_gap(self) -> str:
        """Why the Redis server does not keep what `durability` promises ("" when it does)."""
        node = _node_of(self.client, self.keys.epoch)
        if self.durability.startswith("replicas:"):
            wanted = int(self.durability.split(":", 1)[1])
            try:
                replicas = int(node.info("replication").get("connected_slaves", 0))
            except Exception as exc:  # noqa: BLE001 - INFO may be refused (managed Redis)
                return f"INFO replication refused ({exc}): the replicas cannot be counted"
            return "" if replicas >= wanted else f"the records' Redis server has {replicas} replicas, not {wanted}"
        try:
            appendonly = str(node.config_get("appendonly").get("appendonly", "no"))
            fsync = str(node.config_get("appendfsync").get("appendfsync", ""))
        except Exception as exc:  # noqa: BLE001 - CONFIG may be disabled (managed Redis)
            return f"CONFIG GET refused ({exc}): Redis' persistence cannot be checked"
        if appendonly != "yes":
            return "Redis runs without its AOF (appendonly no): a Redis restart loses acknowledged changes"
        if self.durability == "always" and fsync != "always":
            return f"Redis fsyncs its AOF {fsync}, not always: a host crash loses acknowledged changes"
        if fsync not in ("always", "everysec"):
            return f"Redis fsyncs its AOF when the OS decides ({fsync}): a host crash loses minutes of changes"
        return ""


def _decoded(table: str, field: bytes, value: bytes, decode: Callable[[bytes, bytes], T]) -> T | Unreadable:
    try:
        return decode(field, value)
    except Exception as exc:  # noqa: BLE001 - a record of any shape is data, never a reason not to lead
        return Unreadable(table, field.decode("utf-8", "backslashreplace"), f"{type(exc).__name__}: {exc}")


def _segment(field: bytes, value: bytes) -> SegmentRecord:
    return decode_segment(value)


def _object(field: bytes, value: bytes) -> tuple[str, ObjectRecord]:
    return field.decode("utf-8"), decode_object(value)


def _pin(field: bytes, value: bytes) -> tuple[str, float]:
    return field.decode("utf-8"), decode_pin(value)


def _node_of(client: Any, key: str) -> Any:
    """The plain client of the server that holds `key`: the slot's master on a Redis Cluster."""
    if hasattr(client, "get_node_from_key"):
        return client.get_node_from_key(key).redis_connection
    return client


def _refresh_slots(client: Any) -> None:
    manager = getattr(client, "nodes_manager", None)
    if manager is not None:
        try:
            manager.initialize()
        except Exception as exc:  # noqa: BLE001 - the next write tries again
            log.warning("could not refresh the Redis Cluster's slots: %s", exc)
