"""The metadata service's calls as plain methods: a call value (kvstore.wire.calls) and the
caller in, the reply value out; `handler(name)` is the same with the messages of the wire.

This is the one translation layer between the wire and MetaStore. Both lanes call it: gRPC
(meta.py) and the fast lane (fastlane.py), each with the Principal its caller authenticated as
(auth.py). A method raises KVStoreError for a call that fails as a whole; per-key outcomes travel
inside the reply. Each method makes one call on the store (one lock hold), and is named after its
call (PutStart: put_start).

Isolation happens here: every key a tenant names is put in its namespace before the store sees
it (tenants.py), the lease holder it names too, and what comes back names only its own keys. A
tenant not trusted with shm is offered neither shm nor mooncake endpoints, nor LOCAL grants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kvstore.errors import InvalidArgument, WrongShard
from kvstore.meta import tenant_calls
from kvstore.meta.ha import Single, Stores
from kvstore.meta.store import MetaStore
from kvstore.meta.tenants import DEFAULT_ID, namespace
from kvstore.results import (
    GetReply,
    HeartbeatReply,
    KeyInfo,
    KeyListing,
    KeyResult,
    PutEndReply,
    PutStartReply,
    Reserved,
    ServiceInfoReply,
    StoreStats,
    TenantInfo,
)
from kvstore.server.auth import Principal
from kvstore.shards import ShardMap, ShardSpec, foreign, shard_of
from kvstore.transport.registry import unconfined
from kvstore.types import CheckedKeys, MoveTask, validate_keys
from kvstore.v1 import meta_pb2 as pb
from kvstore.version import __version__
from kvstore.wire import calls, codec
from kvstore.wire.call import Role, snake
from kvstore.wire.calls import CALLS
from kvstore.wire.packed import ROWS

Handler = Callable[[Any, Principal], Any]
_UNCONFINED = unconfined()


def _scrub(statuses: Iterable[pb.Status], who: Principal) -> None:
    """Messages name keys as the store holds them: show a tenant its own names."""
    shown = repr(namespace(who.tenant))[1:-1]
    for status in statuses:
        if status.message:
            status.message = status.message.replace(shown, "")


def _scrub_texts(texts: Any, who: Principal) -> None:
    """The same, for a repeated string field of messages."""
    shown = repr(namespace(who.tenant))[1:-1]
    for i, text in enumerate(texts):
        if shown in text:
            texts[i] = text.replace(shown, "")


def _confine(segments: Iterable[pb.Segment]) -> None:
    """Leave out the endpoints of transports that check no grant per byte range."""
    for seg in segments:
        if any(e.transport in _UNCONFINED for e in seg.endpoints):
            keep = [pb.Endpoint(transport=e.transport, address=e.address) for e in seg.endpoints
                    if e.transport not in _UNCONFINED]  # fmt: skip
            del seg.endpoints[:]
            seg.endpoints.extend(keep)


def _found(msg: Message, kind: str) -> Iterator[Any]:
    """The messages of type `kind` (Status, Segment) in `msg`, at any depth."""
    for fd, value in msg.ListFields():
        if fd.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        for item in value if fd.is_repeated else (value,):
            if fd.message_type is not None and fd.message_type.name == kind:
                yield item
            else:
                yield from _found(item, kind)


class ShardDirectory(Protocol):
    def current(self) -> ShardMap:
        """Every shard's address by index, and the map's epoch."""


class CallObserver(Protocol):
    def wrap(self, name: str, method: Handler) -> Handler:
        """`method` (the handler of RPC `name`) as it is to be called: counted, timed, ..."""


class MetaHandlers:
    """`stores` says which MetaStore answers: reads (nothing durable changes) may be served where
    writes are not (a leader whose Redis fails). `observer`
    (kvstore.metrics.meta.ServiceMetrics, when metrics are on) sees every call of both lanes."""

    def __init__(
        self,
        stores: Stores | MetaStore,
        observer: CallObserver | None = None,
        shard: ShardSpec | None = None,
        shards: ShardDirectory | None = None,
    ) -> None:
        """`shard`: the part of the key space this service owns (a key of another shard is
        WrongShard); `shards`: where the map of every shard is (for ServiceInfo)."""
        self.stores: Stores = stores if not isinstance(stores, MetaStore) else Single(stores)
        self.fast_lane_port = 0
        self.shard = shard or ShardSpec()
        self._shards = shards
        self._observer = observer
        self._wrapped: dict[str, Handler] = {}

    @property
    def _reads(self) -> MetaStore:
        return self.stores.for_reads()

    @property
    def _writes(self) -> MetaStore:
        return self.stores.for_writes()

    def handler(self, name: str) -> Handler:
        """The RPC `name` (as declared in MetaService) from request message to response message:
        it refuses callers whose role may not make it (PermissionDenied), shows a tenant only its
        own names and the transports it is trusted with, and is observed if an observer was given."""
        found = self._wrapped.get(name)
        if found is not None:
            return found
        cls = CALLS[name]
        method: Callable[[Any, Principal], Any] = getattr(self, snake(name))
        response_type = codec.response_type(cls)
        leased = cls.role is not Role.ANYONE  # ServiceInfo and Stats say where the service stands, lease or not
        shown = cls.role is Role.DATA

        def call(request: Any, who: Principal) -> Any:
            who.check(name)
            reply = method(codec.request_from_pb(cls, request), who)
            if leased:
                self.stores.still_answering()  # a lease that ended during the call: no reply from it
            response = cls.reply.to_pb(reply, response_type)
            if shown:
                self._shown(response, who)
            return response

        wrapped = self._observer.wrap(name, call) if self._observer is not None else call
        self._wrapped[name] = wrapped
        return wrapped

    def _keys(self, keys: Sequence[str], who: Principal) -> CheckedKeys:
        """A caller's keys, checked (no NUL: none can name another namespace; all of this
        shard), in its namespace."""
        if not keys:  # a Get's touched keys, most often
            return CheckedKeys([])
        plain = list(keys)
        validate_keys(plain)
        if self.shard.count > 1:
            self._check_shard(plain)
        if who.tenant == DEFAULT_ID:
            return CheckedKeys(plain)
        ns = namespace(who.tenant)
        return CheckedKeys([ns + k for k in plain])

    def _check_shard(self, keys: Sequence[str]) -> None:
        stray = foreign(keys, self.shard.index, self.shard.count)
        if stray is not None:
            epoch = self._shards.current().epoch if self._shards is not None else 0
            raise WrongShard(
                f"{stray!r} belongs to shard {shard_of(stray, self.shard.count)} of {self.shard.count}, not to this "
                f"one ({self.shard}): read the shard map again",
                epoch,
            )

    @staticmethod
    def _holder(client_id: str, who: Principal) -> str:
        return namespace(who.tenant) + client_id if client_id else ""

    @staticmethod
    def _host(client_host: str, who: Principal) -> str:
        """The caller's host for LOCAL (shm) grants: none for a tenant not trusted with shm."""
        return client_host if who.trust_shm else ""

    @staticmethod
    def _shown(response: Message, who: Principal) -> None:
        if who.tenant != DEFAULT_ID:
            _scrub(_found(response, "Status"), who)
            for columns in _found(response, "PackedGetResults"):  # a Get's messages, as a column
                _scrub_texts(columns.messages, who)
        if not who.trust_shm:
            _confine(_found(response, "Segment"))

    def service_info(self, req: calls.ServiceInfo, who: Principal) -> ServiceInfoReply:
        standing = self.stores.standing()
        shards = None
        if self.shard.count > 1:
            shards = self._shards.current() if self._shards is not None else ShardMap(("",) * self.shard.count)
        return ServiceInfoReply(
            __version__, self.fast_lane_port, standing.role, standing.epoch, standing.leader, self.shard.index, shards
        )

    def mount_segment(self, req: calls.MountSegment, who: Principal) -> None:
        self._writes.mount_segment(req.segment)

    def unmount_segment(self, req: calls.UnmountSegment, who: Principal) -> int:
        return self._writes.unmount_segment(req.segment_id)

    def heartbeat(self, req: calls.Heartbeat, who: Principal) -> HeartbeatReply:
        store = self._reads
        unknown = store.heartbeat(req.daemon_id, req.segment_ids)
        return HeartbeatReply(tuple(unknown), int(store.config.heartbeat_ttl_s * 1000))

    def put_start(self, req: calls.PutStart, who: Principal) -> PutStartReply:
        keys = self._keys(req.keys, who)
        return self._writes.put_start(keys, req.sizes, req.replica_num or 1, self._host(req.client_host, who))

    def put_end(self, req: calls.PutEnd, who: Principal) -> PutEndReply:
        keys = self._keys(req.keys, who)
        return self._writes.put_end(keys, req.checksums, req.written, req.failed_segments, unchecked_ok=who.trust_shm)

    def reserve(self, req: calls.Reserve, who: Principal) -> Reserved:
        """A region is a LOCAL grant: a tenant not trusted with shm is offered none (no host)."""
        host = self._host(req.client_host, who)
        return self._writes.regions.reserve(self._holder(req.client_id, who), host, req.size, who.tenant)

    def put_commit(self, req: calls.PutCommit, who: Principal) -> list[KeyResult]:
        return self._writes.regions.put_commit(
            self._holder(req.client_id, who), req.region_id, self._keys(req.keys, who), req.offsets, req.sizes,
            req.checksums, req.released,
        )  # fmt: skip

    def put_revoke(self, req: calls.PutRevoke, who: Principal) -> list[KeyResult]:
        return self._writes.put_revoke(self._keys(req.keys, who), req.failed_segments)

    def get(self, req: calls.Get, who: Principal) -> GetReply:
        reply = self._reads.get(
            self._keys(req.keys, who), req.released, self._host(req.client_host, who),
            self._holder(req.client_id, who), req.failed_segments, self._keys(req.touched, who),
        )  # fmt: skip
        return GetReply(reply.results, reply.segments, reply.lease_ms, min(req.packed, ROWS)) if req.packed else reply

    def release(self, req: calls.Release, who: Principal) -> None:
        self._reads.release(req.released, self._holder(req.client_id, who))

    def exists(self, req: calls.Exists, who: Principal) -> list[bool]:
        return self._reads.exists(self._keys(req.keys, who))

    def match_prefix(self, req: calls.MatchPrefix, who: Principal) -> int:
        return self._reads.match_prefix(self._keys(req.keys, who))

    def remove(self, req: calls.Remove, who: Principal) -> list[KeyResult]:
        keys = self._keys(req.keys, who)
        return self._writes.remove(keys, req.force, req.released, self._holder(req.client_id, who))

    def pin(self, req: calls.Pin, who: Principal) -> list[KeyResult]:
        return self._writes.pin(self._keys(req.keys, who), req.ttl_s)

    def unpin(self, req: calls.Unpin, who: Principal) -> list[KeyResult]:
        return self._writes.unpin(self._keys(req.keys, who))

    def claim_moves(self, req: calls.ClaimMoves, who: Principal) -> list[MoveTask]:
        return self._writes.claim_moves(req.daemon_id, req.max_bytes)

    def complete_moves(self, req: calls.CompleteMoves, who: Principal) -> None:
        self._writes.complete_moves(req.daemon_id, req.outcomes)

    def announce_blocks(self, req: calls.AnnounceBlocks, who: Principal) -> list[KeyResult]:
        return self._writes.announce(req.segment_id, req.blocks)

    def stats(self, req: calls.Stats, who: Principal) -> StoreStats:
        standing = self.stores.standing()
        store = self.stores.current()
        if store is None or who.unchecked is not None:  # a tenant token no registry here checked
            stats = StoreStats(0, 0, 0, 0, 0, 0, 0)
        elif who.admin or who.daemon:
            stats = store.stats()
        else:  # a tenant sees its own keys only
            tenant = store.tenants.by_id(who.tenant)
            if tenant is None:
                raise InvalidArgument(f"tenant {who.name!r} is gone")
            stats = store.tenant_call(lambda st, now: tenant_calls.stats_of(st, tenant))
        return replace(
            stats, role=standing.role, epoch=standing.epoch, leader=standing.leader, shard=self.shard.index,
            shards=self.shard.count, standbys=(*stats.standbys, *standing.standbys), redis=standing.redis,
            reconciling=standing.reconciling, writes_open=standing.writes_open,
        )  # fmt: skip

    def list_keys(self, req: calls.ListKeys, who: Principal) -> KeyListing:
        for text in filter(None, (req.prefix, req.cursor)):
            validate_keys([text])
        ns = namespace(who.tenant)
        cursor = ns + req.cursor if req.cursor else ""
        hidden = "\0" if who.tenant == DEFAULT_ID else ""  # the default tenant's keys have no namespace
        found = self._reads.list_keys(ns + req.prefix, req.limit, cursor, hidden)
        if not ns:
            return found
        return replace(found, keys=tuple(k[len(ns) :] for k in found.keys), next_cursor=found.next_cursor[len(ns) :])

    def describe(self, req: calls.Describe, who: Principal) -> list[KeyInfo]:
        return self._reads.describe(self._keys(req.keys, who))

    # -- tenants (the admin's) -------------------------------------------------------------------

    def tenant_add(self, req: calls.TenantAdd, who: Principal) -> TenantInfo:
        spec = tenant_calls.spec(req.tenant)

        def add(st: Any, now: float) -> TenantInfo:
            return tenant_calls.info(st, st.tenants.add(spec, req.update, req.keep_id))

        return self._writes.tenant_call(add, changes=True)

    def tenant_token(self, req: calls.TenantToken, who: Principal) -> tuple[str, str]:
        token_id, token = self._writes.tenant_call(
            lambda st, now: st.tenants.make_token(req.name, now, req.ttl_s, req.token), True
        )
        return token_id, token

    def tenant_revoke(self, req: calls.TenantRevoke, who: Principal) -> int:
        revoked: int = self._writes.tenant_call(lambda st, now: st.tenants.revoke(req.name, req.token_id), True)
        return revoked

    def tenant_list(self, req: calls.TenantList, who: Principal) -> list[TenantInfo]:
        return self._reads.tenant_call(lambda st, now: [tenant_calls.info(st, t) for t in st.tenants.all()])
