"""ShardedMetaClient: the metadata client of a store whose key space is split over S shards.

It asks the service it is given for the shard map once (ServiceInfo), then sends each key to the
shard that owns it (kvstore/shards.py). A batch is split per shard and its calls are all sent
before any answer is awaited, so a batch over S shards costs one round trip, not S. A service
that answers WRONG_SHARD (the map changed: resharding) makes it read the map again and repeat.
With one shard it is the plain MetaClient it wraps, call for call.

Read leases are the shard's that granted them: the lease ids a reader hands back are sent to
that shard. Tenants exist on every shard: the admin's tenant calls are made on each (shard 0
first, whose ids and tokens the others are given), and a tenant's quotas and reserves are split
evenly over the shards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kvstore import shards
from kvstore.errors import AlreadyExists, KeyNotFound, KVStoreError, PermissionDenied, Unavailable, WrongShard
from kvstore.metaclient import merge as sm
from kvstore.metaclient.client import MetaClient
from kvstore.results import (
    GetReply,
    GetResult,
    KeyInfo,
    KeyListing,
    KeyResult,
    PutEndReply,
    PutStartReply,
    PutStartResult,
    PutWritten,
    ServiceInfo,
    StoreStats,
    TenantInfo,
)
from kvstore.types import SegmentInfo

T = TypeVar("T")
_MAX_KEPT = 4096  # leases kept per shard to hand back with a later call
_MAX_LEASES = 1 << 20  # lease ids remembered for routing their release (a reader hands them back soon)


class ShardedMetaClient:
    """The MetaClient calls of the client SDK and the CLI, routed by shard. Thread safe."""

    def __init__(self, base: MetaClient, make: Callable[[str, int], MetaClient]) -> None:
        """`base`: the client of the address given; `make(address, shard)`: a client for another
        shard's service."""
        self.base = base
        self._make = make
        self._lock = threading.Lock()
        self._clients: list[MetaClient] | None = None
        self._epoch = 0
        self._lease_shard: dict[int, int] = {}
        self._later: dict[int, list[int]] = {}

    # -- the map ----------------------------------------------------------------------------------

    def shard_clients(self) -> list[MetaClient]:
        """One client per shard, by index (one, `base`, when the store is not sharded)."""
        with self._lock:
            clients = self._clients
        if clients is not None:
            return clients
        found = self._discover()
        with self._lock:
            clients = self._clients
            if clients is None:
                self._clients = found
                return found
        for c in found:  # another thread was quicker
            if c is not self.base:
                c.close()
        return clients

    def _discover(self) -> list[MetaClient]:
        try:
            info = self.base.service_info()
        except (Unavailable, PermissionDenied):
            raise
        except KVStoreError:  # a service too old to say: not sharded
            return [self.base]
        if info.shards is None or info.shards.count == 1:
            return [self.base]
        if missing := info.shards.missing(info.shard):
            raise Unavailable(f"the store's shard map has no address for shard(s) {missing} yet: retry")
        self._epoch = info.shards.epoch
        return [
            self.base if i == info.shard else self._make(address, i) for i, address in enumerate(info.shards.addresses)
        ]

    def _forget_map(self, seen: WrongShard) -> None:
        """Read the map again at the next call. The old shards' clients are not closed here:
        another thread may be mid-call on one (they close when collected)."""
        with self._lock:
            if seen.map_epoch >= self._epoch:
                self._clients = None

    def _refresh(self, seen: WrongShard) -> list[MetaClient]:
        self._forget_map(seen)
        return self.shard_clients()

    def _fan(
        self,
        keys: Sequence[str],
        begin: Callable[[list[MetaClient], int, list[int]], Callable[[], T]],
        merge: Callable[[int, Iterable[tuple[list[int], T]]], T],
    ) -> T:
        """A batch split over the shards (merge.fan); keys a shard says are not its own go
        once more over a fresh map, and only they."""
        return sm.fan(self.shard_clients(), keys, begin, merge, self._refresh)

    def _routed(self, call: Callable[[list[MetaClient]], T]) -> T:
        """Run `call` over the shard clients; once more over a fresh map if a shard says the key
        is not its own (for calls safe to repeat whole: reads, pins)."""
        try:
            return call(self.shard_clients())
        except WrongShard as exc:
            self._forget_map(exc)
            return call(self.shard_clients())

    def _single(self) -> MetaClient | None:
        """The only shard's client when the store is not sharded: then every call is its own."""
        cs = self.shard_clients()
        return cs[0] if len(cs) == 1 else None

    @property
    def shard_count(self) -> int:
        return len(self.shard_clients())

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients or [], None
        for c in clients:
            if c is not self.base:
                c.close()
        self.base.close()

    def __enter__(self) -> ShardedMetaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        """Calls with no key to route (ServiceInfo, the daemons' calls): the given service's."""
        return getattr(self.base, name)

    # -- keyed calls --------------------------------------------------------------------------------

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if (one := self._single()) is not None:
            return one.exists(keys)
        return self._fan(keys, lambda cs, i, idx: cs[i].begin_exists(sm.pick(keys, idx)), sm.concat)

    def match_prefix(self, keys: Sequence[str]) -> int:
        """One call when the chain's keys share a shard (a hash tag); else Exists on every shard
        at once and the leading run counted here."""

        if (one := self._single()) is not None:
            return one.match_prefix(keys)

        def call(cs: list[MetaClient]) -> int:
            parts = shards.split(keys, len(cs))
            if len(parts) == 1:
                (shard,) = parts
                return cs[shard].match_prefix(keys)
            found = sm.fan(cs, keys, lambda cs, i, idx: cs[i].begin_exists(sm.pick(keys, idx)), sm.concat)
            return next((i for i, hit in enumerate(found) if not hit), len(found))

        return self._routed(call)

    def put_start(
        self, keys: Sequence[str], sizes: Sequence[int], replica_num: int = 1, client_host: str = ""
    ) -> PutStartReply:
        if (one := self._single()) is not None:
            return one.put_start(keys, sizes, replica_num, client_host)
        sm.same_length(keys, sizes, "sizes")

        def begin(cs: list[MetaClient], i: int, idx: list[int]) -> Callable[[], PutStartReply]:
            return cs[i].begin_put_start(sm.pick(keys, idx), sm.pick(sizes, idx), replica_num, client_host)

        def join(n: int, parts: Iterable[tuple[list[int], PutStartReply]]) -> PutStartReply:
            results: list[PutStartResult] = [PutStartResult()] * n
            segments: dict[str, SegmentInfo] = {}
            for idx, reply in parts:
                sm.place(results, idx, reply.results)
                segments.update(reply.segments)
            return PutStartReply(tuple(results), segments)

        return self._fan(keys, begin, join)

    def put_end(
        self,
        keys: Sequence[str],
        checksums: Sequence[int],
        written: Sequence[PutWritten] = (),
        failed_segments: Sequence[str] = (),
    ) -> PutEndReply:
        if (one := self._single()) is not None:
            return one.put_end(keys, checksums, written, failed_segments)
        sm.same_length(keys, checksums, "checksums")
        if written:
            sm.same_length(keys, written, "written")

        def begin(cs: list[MetaClient], i: int, idx: list[int]) -> Callable[[], PutEndReply]:
            return cs[i].begin_put_end(
                sm.pick(keys, idx),
                sm.pick(checksums, idx),
                sm.pick(written, idx) if written else (),
                failed_segments,
            )

        def join(n: int, parts: Iterable[tuple[list[int], PutEndReply]]) -> PutEndReply:
            results: list[KeyResult] = [KeyResult()] * n
            replicas = [0] * n
            for idx, reply in parts:
                sm.place(results, idx, reply.results)
                sm.place(replicas, idx, reply.replicas or [0] * len(idx))
            return PutEndReply(tuple(results), tuple(replicas))

        return self._fan(keys, begin, join)

    def put_revoke(self, keys: Sequence[str], failed_segments: Sequence[str] = ()) -> list[KeyResult]:
        if (one := self._single()) is not None:
            return one.put_revoke(keys, failed_segments)
        return self._fan(
            keys, lambda cs, i, idx: cs[i].begin_put_revoke(sm.pick(keys, idx), failed_segments), sm.concat
        )

    def get(
        self,
        keys: Sequence[str],
        released: Sequence[int] = (),
        client_host: str = "",
        client_id: str = "",
        failed_segments: Sequence[str] = (),
        touched: Sequence[str] = (),
    ) -> GetReply:
        """`touched`: keys read from cached locations, each marked recently used by its own shard
        (with this call where it visits that shard, else with a Get of no keys)."""
        if (one := self._single()) is not None:
            return one.get(keys, released, client_host, client_id, failed_segments, touched)

        cs = self.shard_clients()
        handed = self._release_by_shard(released)
        touches = {i: sm.pick(touched, idx) for i, idx in shards.split(touched, len(cs)).items()}

        def begin(now: list[MetaClient], i: int, idx: list[int]) -> Callable[[], GetReply]:
            first = now is cs  # leases and touches were sorted by this map's shards
            leases, mine = (handed.pop(i, []), touches.pop(i, [])) if first else ([], [])
            return now[i].begin_get(sm.pick(keys, idx), leases, client_host, client_id, failed_segments, mine)

        try:
            reply = sm.fan(cs, keys, begin, sm.merge_gets, self._refresh)
        except BaseException:
            self._keep_for_later(handed)  # those not sent yet
            raise
        self._remember_leases(keys, reply.results, self.shard_count)
        # Shards the Get did not visit: their touches (hints), and on a Get of no keys (the
        # reader handing leases back) their leases too; other leases go with a later call.
        for i in sorted(set(touches) | (set(handed) if not keys else set())):
            leases = handed.pop(i, [])
            try:
                cs[i].get([], leases, client_host, client_id, (), touches.get(i, []))
            except KVStoreError:  # a hint lost; the leases go with a later call
                handed.setdefault(i, []).extend(leases)
        self._keep_for_later(handed)
        return reply

    def remove(
        self, keys: Sequence[str], force: bool = False, released: Sequence[int] = (), client_id: str = ""
    ) -> list[KeyResult]:
        if (one := self._single()) is not None:
            return one.remove(keys, force, released, client_id)

        cs = self.shard_clients()
        handed = self._release_by_shard(released)

        def begin(now: list[MetaClient], i: int, idx: list[int]) -> Callable[[], list[KeyResult]]:
            return now[i].begin_remove(sm.pick(keys, idx), force, handed.pop(i, ()) if now is cs else (), client_id)

        try:
            results = sm.fan(cs, keys, begin, sm.concat, self._refresh)
        except BaseException:
            self._keep_for_later(handed)  # those not sent yet
            raise
        for shard, leases in handed.items():  # a Remove of no keys is how a reader hands leases back
            cs[shard].remove([], False, leases, client_id)
        return results

    def pin(self, keys: Sequence[str], ttl_s: float) -> list[KeyResult]:
        return self._routed(lambda cs: sm.serially(cs, keys, lambda c, sub: c.pin(sub, ttl_s)))

    def unpin(self, keys: Sequence[str]) -> list[KeyResult]:
        return self._routed(lambda cs: sm.serially(cs, keys, lambda c, sub: c.unpin(sub)))

    def describe(self, keys: Sequence[str]) -> list[KeyInfo]:
        return self._routed(lambda cs: sm.serially(cs, keys, lambda c, sub: c.describe(sub)))

    # -- read leases ------------------------------------------------------------------------------

    def _remember_leases(self, keys: Sequence[str], results: Sequence[GetResult], count: int) -> None:
        with self._lock:
            if len(self._lease_shard) > _MAX_LEASES:
                self._lease_shard.clear()  # a reader that never hands leases back: they expire anyway
            for key, r in zip(keys, results):
                if r.lease_id:
                    self._lease_shard[r.lease_id] = shards.shard_of(key, count)

    def _release_by_shard(self, released: Sequence[int]) -> dict[int, list[int]]:
        """The leases to hand back, by the shard that granted them (with those kept from before)."""
        with self._lock:
            out, self._later = self._later, {}
            for lease in released:
                shard = self._lease_shard.pop(lease, None)
                if shard is not None:
                    out.setdefault(shard, []).append(lease)
        return out

    def _keep_for_later(self, handed: dict[int, list[int]]) -> None:
        """Leases of shards a Get did not visit go with the next call that visits them."""
        with self._lock:
            for shard, leases in handed.items():
                kept = self._later.setdefault(shard, [])
                kept.extend(leases)
                del kept[:-_MAX_KEPT]  # a shard never visited again: the oldest run out on their own

    # -- whole-store calls ------------------------------------------------------------------------

    def service_info(self) -> ServiceInfo:
        return self.base.service_info()

    def stats(self) -> StoreStats:
        cs = self.shard_clients()
        if len(cs) == 1:
            return cs[0].stats()
        finishers = [c.begin_stats() for c in cs]
        return sm.add_stats([finish() for finish in finishers])

    def list_keys(self, prefix: str = "", limit: int = 0, cursor: str = "") -> KeyListing:
        """The shards' pages merged in byte order: the first `limit` of all of them."""
        cs = self.shard_clients()
        if len(cs) == 1:
            return cs[0].list_keys(prefix, limit, cursor)
        return sm.merge_pages([c.list_keys(prefix, limit, cursor) for c in cs], limit)

    # -- tenants: on every shard --------------------------------------------------------------------

    def tenant_add(self, tenant: TenantInfo, update: bool = False) -> TenantInfo:
        cs = self.shard_clients()
        if len(cs) == 1:
            return cs[0].tenant_add(tenant, update)
        share = sm.split_bytes(tenant, len(cs))
        made = cs[0].tenant_add(share, update)
        for c in cs[1:]:
            alike = replace(share, id=made.id)
            try:
                c.tenant_add(alike, update, keep_id=True)
            except (AlreadyExists, KeyNotFound):  # an earlier call stopped part way: this shard's differs
                c.tenant_add(alike, not update, keep_id=True)
        return replace(made, quotas=tenant.quotas, reserved=tenant.reserved)

    def tenant_token(self, name: str, ttl_s: float = 0.0) -> tuple[str, str]:
        cs = self.shard_clients()
        token_id, token = cs[0].tenant_token(name, ttl_s)
        for c in cs[1:]:
            c.tenant_token(name, ttl_s, token=token)
        return token_id, token

    def tenant_revoke(self, name: str, token_id: str = "") -> int:
        cs = self.shard_clients()
        revoked = cs[0].tenant_revoke(name, token_id)
        for c in cs[1:]:
            c.tenant_revoke(name, token_id)
        return revoked

    def tenant_list(self) -> list[TenantInfo]:
        cs = self.shard_clients()
        if len(cs) == 1:
            return cs[0].tenant_list()
        return sm.merge_tenants([c.tenant_list() for c in cs])


def client_for(base: MetaClient) -> ShardedMetaClient:
    """The sharded client over `base`, making the other shards' clients like it."""

    def make(address: str, shard: int) -> MetaClient:
        return base.like(address, shard)

    return ShardedMetaClient(base, make)
