"""The metadata service's calls as plain methods: a request message and the caller in, a
response message out.

This is the one translation layer between the wire (kvstore.v1 messages, converted by
kvstore.wire.convert) and MetaStore. Both lanes call it: gRPC (meta.py) and the fast lane
(fastlane.py), each with the Principal its caller authenticated as (auth.py). A method raises
KVStoreError for a call that fails as a whole; per-key outcomes travel inside the response.
Each method makes one call on the store (one lock hold).

Isolation happens here: every key a tenant names is put in its namespace before the store sees
it (tenants.py), the lease holder it names too, and what comes back names only its own keys. A
tenant not trusted with shm is offered neither shm nor mooncake endpoints, nor LOCAL grants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from kvstore.errors import InvalidArgument, WrongShard
from kvstore.meta import tenant_calls
from kvstore.meta.ha import Single, Stores
from kvstore.meta.store import MetaStore
from kvstore.meta.tenants import DEFAULT_ID, namespace
from kvstore.server.auth import ANYONE, Principal
from kvstore.shards import ShardMap, ShardSpec, foreign, shard_of
from kvstore.transport.registry import unconfined
from kvstore.types import CheckedKeys, validate_keys
from kvstore.v1 import meta_pb2 as pb
from kvstore.version import __version__
from kvstore.wire import convert, tenant_info
from kvstore.wire import listing as wire_keys

Handler = Callable[[Any, Principal], Any]
_UNCONFINED = unconfined()


def _scrub(statuses: Iterable[pb.Status], who: Principal) -> None:
    """Messages name keys as the store holds them: show a tenant its own names."""
    shown = repr(namespace(who.tenant))[1:-1]
    for status in statuses:
        if status.message:
            status.message = status.message.replace(shown, "")


def _confine(segments: Iterable[pb.Segment]) -> None:
    """Leave out the endpoints of transports that check no grant per byte range."""
    for seg in segments:
        if any(e.transport in _UNCONFINED for e in seg.endpoints):
            keep = [pb.Endpoint(transport=e.transport, address=e.address) for e in seg.endpoints
                    if e.transport not in _UNCONFINED]  # fmt: skip
            del seg.endpoints[:]
            seg.endpoints.extend(keep)


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
        """The method for the RPC `name` (as declared in MetaService): it refuses callers whose
        role may not make it (PermissionDenied), and is observed if an observer was given."""
        found = self._wrapped.get(name)
        if found is not None:
            return found
        method: Handler = getattr(self, name)

        leased = name not in ANYONE  # ServiceInfo and Stats say where the service stands, lease or not

        def call(request: Any, who: Principal) -> Any:
            who.check(name)
            reply = method(request, who)
            if leased:
                self.stores.still_answering()  # a lease that ended during the call: no reply from it
            return reply

        wrapped = self._observer.wrap(name, call) if self._observer is not None else call
        self._wrapped[name] = wrapped
        return wrapped

    def _keys(self, keys: Sequence[str], who: Principal) -> CheckedKeys:
        """A caller's keys, checked (no NUL: none can name another namespace; all of this
        shard), in its namespace."""
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
    def _shown(statuses: Iterable[pb.Status], who: Principal, segments: Iterable[pb.Segment] = ()) -> None:
        if who.tenant != DEFAULT_ID:
            _scrub(statuses, who)
        if not who.trust_shm:
            _confine(segments)

    def ServiceInfo(self, request: pb.ServiceInfoRequest, who: Principal) -> pb.ServiceInfoResponse:
        standing = self.stores.standing()
        shard_map = self._shards.current() if self._shards is not None and self.shard.count > 1 else None
        return pb.ServiceInfoResponse(
            version=__version__,
            fast_lane_port=self.fast_lane_port,
            role=standing.role,
            epoch=standing.epoch,
            leader=standing.leader,
            shard=self.shard.index,
            shards=self.shard.count,
            shard_addresses=shard_map.addresses if shard_map is not None else (),
            map_epoch=shard_map.epoch if shard_map is not None else 0,
        )

    def MountSegment(self, request: pb.MountSegmentRequest, who: Principal) -> pb.MountSegmentResponse:
        if not request.HasField("segment"):
            raise InvalidArgument("MountSegment needs a segment")
        self._writes.mount_segment(convert.segment_from_pb(request.segment))
        return pb.MountSegmentResponse()

    def UnmountSegment(self, request: pb.UnmountSegmentRequest, who: Principal) -> pb.UnmountSegmentResponse:
        return pb.UnmountSegmentResponse(replicas_dropped=self._writes.unmount_segment(request.segment_id))

    def Heartbeat(self, request: pb.HeartbeatRequest, who: Principal) -> pb.HeartbeatResponse:
        store = self._reads
        unknown = store.heartbeat(request.daemon_id, list(request.segment_ids))
        return pb.HeartbeatResponse(unknown_segment_ids=unknown, ttl_ms=int(store.config.heartbeat_ttl_s * 1000))

    def PutStart(self, request: pb.PutStartRequest, who: Principal) -> pb.PutStartResponse:
        keys = self._keys(request.keys, who)
        host = self._host(request.client_host, who)
        reply = self._writes.put_start(keys, list(request.sizes), request.replica_num or 1, host)
        response = convert.put_start_reply_to_pb(reply)
        self._shown((r.status for r in response.results), who, response.segments)
        return response

    def PutEnd(self, request: pb.PutEndRequest, who: Principal) -> pb.PutEndResponse:
        written = [convert.put_written_from_pb(w) for w in request.written]
        keys = self._keys(request.keys, who)
        reply = self._writes.put_end(
            keys, list(request.checksums), written, list(request.failed_segments), unchecked_ok=who.trust_shm
        )
        response = convert.put_end_reply_to_pb(reply)
        self._shown(response.results, who)
        return response

    def Reserve(self, request: pb.ReserveRequest, who: Principal) -> pb.ReserveResponse:
        """A region is a LOCAL grant: a tenant not trusted with shm is offered none (no host)."""
        host = self._host(request.client_host, who)
        reserved = self._writes.regions.reserve(self._holder(request.client_id, who), host, request.bytes, who.tenant)
        return convert.reserved_to_pb(reserved)

    def PutCommit(self, request: pb.PutCommitRequest, who: Principal) -> pb.PutCommitResponse:
        results = self._writes.regions.put_commit(
            self._holder(request.client_id, who),
            request.region_id,
            self._keys(request.keys, who),
            list(request.offsets),
            list(request.sizes),
            list(request.checksums),
            list(request.released),
        )
        response = pb.PutCommitResponse(results=convert.key_results_to_pb(results))
        self._shown(response.results, who)
        return response

    def PutRevoke(self, request: pb.PutRevokeRequest, who: Principal) -> pb.PutRevokeResponse:
        results = self._writes.put_revoke(self._keys(request.keys, who), list(request.failed_segments))
        response = pb.PutRevokeResponse(results=convert.key_results_to_pb(results))
        self._shown(response.results, who)
        return response

    def Get(self, request: pb.GetRequest, who: Principal) -> pb.GetResponse:
        reply = self._reads.get(
            self._keys(request.keys, who),
            list(request.released),
            self._host(request.client_host, who),
            self._holder(request.client_id, who),
            list(request.failed_segments),
            self._keys(request.touched, who),
        )
        response = convert.get_reply_to_pb(reply)
        self._shown((r.status for r in response.results), who, response.segments)
        return response

    def Exists(self, request: pb.ExistsRequest, who: Principal) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=self._reads.exists(self._keys(request.keys, who)))

    def MatchPrefix(self, request: pb.MatchPrefixRequest, who: Principal) -> pb.MatchPrefixResponse:
        return pb.MatchPrefixResponse(count=self._reads.match_prefix(self._keys(request.keys, who)))

    def Remove(self, request: pb.RemoveRequest, who: Principal) -> pb.RemoveResponse:
        keys = self._keys(request.keys, who)
        holder = self._holder(request.client_id, who)
        results = self._writes.remove(keys, request.force, list(request.released), holder)
        response = pb.RemoveResponse(results=convert.key_results_to_pb(results))
        self._shown(response.results, who)
        return response

    def Pin(self, request: pb.PinRequest, who: Principal) -> pb.PinResponse:
        results = self._writes.pin(self._keys(request.keys, who), request.ttl_ms / 1000)
        response = pb.PinResponse(results=convert.key_results_to_pb(results))
        self._shown(response.results, who)
        return response

    def Unpin(self, request: pb.UnpinRequest, who: Principal) -> pb.UnpinResponse:
        response = pb.UnpinResponse(
            results=convert.key_results_to_pb(self._writes.unpin(self._keys(request.keys, who)))
        )
        self._shown(response.results, who)
        return response

    def ClaimMoves(self, request: pb.ClaimMovesRequest, who: Principal) -> pb.ClaimMovesResponse:
        tasks = self._writes.claim_moves(request.daemon_id, request.max_bytes)
        return pb.ClaimMovesResponse(tasks=[convert.move_to_pb(t) for t in tasks])

    def CompleteMoves(self, request: pb.CompleteMovesRequest, who: Principal) -> pb.CompleteMovesResponse:
        self._writes.complete_moves(request.daemon_id, convert.move_outcomes_from_pb(request.results))
        return pb.CompleteMovesResponse()

    def AnnounceBlocks(self, request: pb.AnnounceBlocksRequest, who: Principal) -> pb.AnnounceBlocksResponse:
        results = self._writes.announce(request.segment_id, convert.blocks_from_pb(request.blocks))
        return pb.AnnounceBlocksResponse(results=convert.key_results_to_pb(results))

    def Stats(self, request: pb.StatsRequest, who: Principal) -> pb.StatsResponse:
        standing = self.stores.standing()
        store = self.stores.current()
        if store is None or who.unchecked is not None:  # a tenant token no registry here checked
            response = pb.StatsResponse()
        elif who.admin or who.daemon:
            response = convert.stats_to_pb(store.stats())
        else:  # a tenant sees its own keys only
            tenant = store.tenants.by_id(who.tenant)
            if tenant is None:
                raise InvalidArgument(f"tenant {who.name!r} is gone")
            response = convert.stats_to_pb(store.tenant_call(lambda st, now: tenant_calls.stats_of(st, tenant)))
        response.role, response.epoch, response.leader = standing.role, standing.epoch, standing.leader
        response.shard, response.shards = self.shard.index, self.shard.count
        response.standbys.extend(standing.standbys)
        response.redis, response.reconciling, response.writes_open = (
            standing.redis,
            standing.reconciling,
            standing.writes_open,
        )
        return response

    def ListKeys(self, request: pb.ListKeysRequest, who: Principal) -> pb.ListKeysResponse:
        for text in filter(None, (request.prefix, request.cursor)):
            validate_keys([text])
        ns = namespace(who.tenant)
        cursor = ns + request.cursor if request.cursor else ""
        hidden = "\0" if who.tenant == DEFAULT_ID else ""  # the default tenant's keys have no namespace
        listing = self._reads.list_keys(ns + request.prefix, request.limit, cursor, hidden)
        response = wire_keys.listing_to_pb(listing)
        if ns:
            keys = [k[len(ns) :] for k in response.keys]
            del response.keys[:]
            response.keys.extend(keys)
            response.next_cursor = response.next_cursor[len(ns) :]
        return response

    def Describe(self, request: pb.DescribeRequest, who: Principal) -> pb.DescribeResponse:
        infos = self._reads.describe(self._keys(request.keys, who))
        response = pb.DescribeResponse(keys=[wire_keys.key_info_to_pb(i) for i in infos])
        self._shown((k.status for k in response.keys), who)
        return response

    # -- tenants (the admin's) -------------------------------------------------------------------

    def TenantAdd(self, request: pb.TenantAddRequest, who: Principal) -> pb.TenantAddResponse:
        spec = tenant_calls.spec(tenant_info.tenant_from_pb(request.tenant))

        def add(st: Any, now: float) -> Any:
            return tenant_calls.info(st, st.tenants.add(spec, request.update, request.keep_id))

        return pb.TenantAddResponse(tenant=tenant_info.tenant_to_pb(self._writes.tenant_call(add, changes=True)))

    def TenantToken(self, request: pb.TenantTokenRequest, who: Principal) -> pb.TenantTokenResponse:
        ttl_s = request.ttl_ms / 1000
        token_id, token = self._writes.tenant_call(
            lambda st, now: st.tenants.make_token(request.name, now, ttl_s, request.token), True
        )
        return pb.TenantTokenResponse(token=token, token_id=token_id)

    def TenantRevoke(self, request: pb.TenantRevokeRequest, who: Principal) -> pb.TenantRevokeResponse:
        revoked = self._writes.tenant_call(lambda st, now: st.tenants.revoke(request.name, request.token_id), True)
        return pb.TenantRevokeResponse(revoked=revoked)

    def TenantList(self, request: pb.TenantListRequest, who: Principal) -> pb.TenantListResponse:
        infos = self._reads.tenant_call(lambda st, now: [tenant_calls.info(st, t) for t in st.tenants.all()])
        return pb.TenantListResponse(tenants=[tenant_info.tenant_to_pb(i) for i in infos])
