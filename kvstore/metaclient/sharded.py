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
from typing import Any, TypeVar, cast

from kvstore import shards
from kvstore.errors import AlreadyExists, KeyNotFound, KVStoreError, PermissionDenied, Unavailable, WrongShard
from kvstore.metaclient import merge as sm
from kvstore.metaclient.client import MetaClient
from kvstore.results import GetReply, GetResult
from kvstore.wire.call import Call, Fan
from kvstore.wire.calls import Exists, ServiceInfo

T = TypeVar("T")
R = TypeVar("R")
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
            info = self.base.call(ServiceInfo())
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

    # -- the given service's ---------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.base.address

    @property
    def current(self) -> str:
        """The address calls with no key to route (Fan.BASE) go to now."""
        return self.base.current

    @property
    def fast_lane_port(self) -> int:
        return self.base.fast_lane_port

    # -- calls --------------------------------------------------------------------------------------

    def call(self, req: Call[R], timeout_s: float | None = None, retry_s: float = 0.0) -> R:
        """The reply to `req`, made where its `fan` says: calls with no key to route (ServiceInfo,
        the daemons' calls, regions) on the given service; keyed calls split by shard, sent at
        once and merged; whole-store calls on every shard."""
        if req.fan is Fan.BASE:
            return self.base.call(req, timeout_s, retry_s)
        if (one := self._single()) is not None:
            return one.call(req, timeout_s, retry_s)
        if req.fan is Fan.SPLIT:
            return self._split(req, timeout_s)
        if req.fan is Fan.EVERY:
            return self._every(req, timeout_s)
        if req.fan is Fan.PREFIX:
            return self._routed(lambda cs: self._prefix(cs, req, timeout_s))
        return self._tenants(req, timeout_s)

    def begin(self, req: Call[R], timeout_s: float | None = None) -> Callable[[], R]:
        """`req` sent now where one service answers it; a call over several shards is made
        before this returns (each shard's part is sent at once anyway)."""
        if req.fan is Fan.BASE:
            return self.base.begin(req, timeout_s)
        if (one := self._single()) is not None:
            return one.begin(req, timeout_s)
        reply = self.call(req, timeout_s)
        return lambda: reply

    def _split(self, req: Call[R], timeout_s: float | None) -> R:
        """Each shard its own keys' part (merge.fan); keys a shard says are not its own go once
        more over a fresh map, and only they. Read leases handed back go to the shards that
        granted them; touched keys to the shards that own them."""
        keys = sm.keys_of(req)
        sm.check_keyed(req)
        merge = sm.merge_of(req)
        if not req.leases:
            return sm.fan(self.shard_clients(), keys, lambda cs, i, idx: cs[i].begin(sm.part(req, idx), timeout_s),
                          lambda n, parts: merge(req, n, parts), self._refresh)  # fmt: skip
        cs = self.shard_clients()
        handed = self._release_by_shard(req.value("released"))
        touched: Sequence[str] = req.value("touched") if req.hints else ()
        touches = {i: sm.pick(touched, idx) for i, idx in shards.split(touched, len(cs)).items()}
        hints = req.hints

        def begin(now: list[MetaClient], i: int, idx: list[int]) -> Callable[[], R]:
            first = now is cs  # leases and touches were sorted by this map's shards
            leases, mine = (handed.pop(i, []), touches.pop(i, [])) if first else ([], [])
            extra: dict[str, Any] = {"released": leases, **({"touched": mine} if hints else {})}
            return now[i].begin(replace(sm.part(req, idx), **extra), timeout_s)

        try:
            reply = sm.fan(cs, keys, begin, lambda n, parts: merge(req, n, parts), self._refresh)
        except BaseException:
            self._keep_for_later(handed)  # those not sent yet
            raise
        if isinstance(reply, GetReply):
            self._remember_leases(keys, reply.results, self.shard_count)
        # Shards the call did not visit: their touches (hints); their leases too where the call
        # hands leases back at once (Remove), or had no keys (a reader handing leases back).
        # Other leases go with a later call.
        now = set(handed) if (not keys or not hints) else set()
        for i in sorted(set(touches) | now):
            leases = handed.pop(i, [])
            extra: dict[str, Any] = {"released": leases}
            if hints:  # a hint goes alone: no failure report rides it to a shard the reader did not ask
                extra.update(touched=touches.get(i, []), failed_segments=())
            try:
                cs[i].call(replace(sm.part(req, []), **extra), timeout_s)
            except KVStoreError:
                if not hints:
                    raise
                handed.setdefault(i, []).extend(leases)  # a hint lost; the leases go with a later call
        self._keep_for_later(handed)
        return reply

    def _prefix(self, cs: list[MetaClient], req: Call[R], timeout_s: float | None) -> R:
        """One call when the chain's keys share a shard (a hash tag); else Exists on every shard
        at once and the leading run counted here."""
        keys = sm.keys_of(req)
        parts = shards.split(keys, len(cs))
        if len(parts) == 1:
            (shard,) = parts
            return cs[shard].call(req, timeout_s)
        found = sm.fan(cs, keys, lambda cs, i, idx: cs[i].begin(Exists(sm.pick(keys, idx)), timeout_s), sm.concat)
        count: Any = next((i for i, hit in enumerate(found) if not hit), len(found))
        return cast(R, count)

    def _every(self, req: Call[R], timeout_s: float | None) -> R:
        finishers = [c.begin(req, timeout_s) for c in self.shard_clients()]
        return sm.merge_of(req)(req, len(finishers), [([], finish()) for finish in finishers])

    def _tenants(self, req: Call[R], timeout_s: float | None) -> R:
        """Tenants exist on every shard: shard 0 first, whose answer (a tenant's id, a token) the
        others are given."""
        cs = self.shard_clients()
        first = req.first(len(cs))
        made = cs[0].call(first, timeout_s)
        for c in cs[1:]:
            alike = first.then(made)
            try:
                c.call(alike, timeout_s)
            except (AlreadyExists, KeyNotFound):  # an earlier call stopped part way: this shard's differs
                instead = alike.again()
                if instead is None:
                    raise
                c.call(instead, timeout_s)
        return req.joined(made)

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


def client_for(base: MetaClient) -> ShardedMetaClient:
    """The sharded client over `base`, making the other shards' clients like it."""

    def make(address: str, shard: int) -> MetaClient:
        return base.like(address, shard)

    return ShardedMetaClient(base, make)
