"""MetaClient: every call of the metadata service as a typed method.

The one way any process talks to the service: the client SDK, the storage daemon and its tier
mover all use it. Arguments and results are the plain types of kvstore.types and
kvstore.results; protobuf stays in kvstore.wire.convert. Thread safe.

`address` names one service ("host:port"), several ("h1:p1,h2:p2": a leader and its standbys),
or a Redis URL ("redis://host:port/db?cluster=NAME") where the leader is looked up. A call a
standby refuses (NotLeader) goes to the leader it names; a call that finds a service down goes
to the next one. Calls safe to repeat are retried while no service answers, until `retry_s`;
a PutStart whose answer was lost is never repeated (the writer revokes it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvstore import tokens
from kvstore.errors import NotLeader, Unavailable, WrongShard
from kvstore.metaclient.channel import MetaChannel
from kvstore.metaclient.targets import Targets
from kvstore.results import (
    Block,
    GetReply,
    HeartbeatReply,
    KeyInfo,
    KeyListing,
    KeyResult,
    MoveOutcome,
    PutEndReply,
    PutStartReply,
    PutWritten,
    Reserved,
    ServiceInfo,
    StoreStats,
    TenantInfo,
)
from kvstore.tls import TlsFiles
from kvstore.types import MoveTask, SegmentInfo
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire import convert, listing, tenant_info

_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
_MAX_HOPS = 4  # NotLeader redirections followed for one call


class MetaClient:
    def __init__(
        self,
        address: str,
        timeout_s: float = 10.0,
        fast_lane: bool = True,
        token: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """`token`: the bearer token calls carry (None: $KVSTORE_TOKEN, else the token file);
        `tls`: speak TLS to the service, checking it against `tls.ca`."""
        self.address = address
        self.timeout_s = timeout_s
        self._fast_lane = fast_lane
        self._token = tokens.client_token() if token is None else token
        if self._token:
            tokens.check_sendable(self._token)
        self._tls = tls
        self._targets = Targets(address)
        self._channels: dict[str, MetaChannel] = {}
        self._lock = threading.Lock()

    def like(self, address: str, shard: int) -> MetaClient:
        """A client of shard `shard` (at `address`, or where this client's Redis names its leader)
        with this client's token, TLS and timeouts."""
        target = self._targets.for_shard(shard) or address
        return MetaClient(target, self.timeout_s, self._fast_lane, self._token, self._tls)

    @property
    def current(self) -> str:
        """The service address calls go to now."""
        return self._targets.current

    @property
    def fast_lane_port(self) -> int:
        """The fast lane's port in use, 0 while calls go over gRPC."""
        return self._channel(self._targets.current).fast_lane_port

    def _channel(self, address: str) -> MetaChannel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = MetaChannel(
                    address, self.timeout_s, self._fast_lane, self._token, self._tls
                )
            return channel

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> MetaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, name: str, request: Any, timeout_s: float | None = None, retry_s: float = 0.0, repeatable: bool = True
    ) -> Any:
        """One call, followed to the leader; while no service answers, again with backoff for up
        to `retry_s` (only if `repeatable`: a call whose outcome is unknown is not sent twice)."""
        give_up = time.monotonic() + retry_s
        attempt = hops = 0
        while True:
            address = self._targets.current
            try:
                return self._channel(address).call(name, request, timeout_s)
            except NotLeader as exc:  # not executed there: always safe to send to the leader
                hops += 1
                if self._targets.follow(exc.leader, address) and hops <= _MAX_HOPS:
                    continue
                failure: Unavailable = exc
            except WrongShard:  # a stale shard map, not an outage: only the sharded client can mend it
                raise
            except Unavailable as exc:
                if not repeatable:
                    raise
                if self._targets.next_after(address) and attempt < len(self._targets):
                    attempt += 1
                    continue
                failure = exc
            pause = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
            if time.monotonic() + pause >= give_up:
                raise failure
            time.sleep(pause)  # no service answers (an election, or all down): wait, then ask again
            attempt += 1

    def _begin(
        self, name: str, request: Any, timeout_s: float | None = None, repeatable: bool = True
    ) -> Callable[[], Any]:
        """Send one call now; what is returned waits for its answer. A call that meets a standby
        or no service is finished the way `_call` makes it, synchronously."""

        def again() -> Any:
            return self._call(name, request, timeout_s, repeatable=repeatable)

        address = ""
        try:
            address = self._targets.current
            finish = self._channel(address).begin(name, request, timeout_s)
        except Unavailable:
            if not repeatable:
                raise
            return again

        def done() -> Any:
            try:
                return finish()
            except NotLeader as exc:  # not executed there
                self._targets.follow(exc.leader, address)
                return again()
            except WrongShard:
                raise
            except Unavailable:  # as `_call` does: again only where there is another service to ask
                if not repeatable or not self._targets.next_after(address):
                    raise
                return again()

        return done

    # -- engines' calls ---------------------------------------------------------------------------

    def service_info(self) -> ServiceInfo:
        return convert.service_info_from_pb(self._call("ServiceInfo", pb.ServiceInfoRequest()))

    def exists(self, keys: Sequence[str]) -> list[bool]:
        return self.begin_exists(keys)()

    def begin_exists(self, keys: Sequence[str]) -> Callable[[], list[bool]]:
        finish = self._begin("Exists", pb.ExistsRequest(keys=keys))
        return lambda: list(finish().exists)

    def match_prefix(self, keys: Sequence[str]) -> int:
        return int(self._call("MatchPrefix", pb.MatchPrefixRequest(keys=keys)).count)

    def put_start(
        self, keys: Sequence[str], sizes: Sequence[int], replica_num: int = 1, client_host: str = ""
    ) -> PutStartReply:
        """Never retried: a PutStart whose answer was lost may have reserved space."""
        return self.begin_put_start(keys, sizes, replica_num, client_host)()

    def begin_put_start(
        self, keys: Sequence[str], sizes: Sequence[int], replica_num: int = 1, client_host: str = ""
    ) -> Callable[[], PutStartReply]:
        request = pb.PutStartRequest(keys=keys, sizes=sizes, replica_num=replica_num, client_host=client_host)
        finish = self._begin("PutStart", request, repeatable=False)
        return lambda: convert.put_start_reply_from_pb(finish())

    def put_end(
        self,
        keys: Sequence[str],
        checksums: Sequence[int],
        written: Sequence[PutWritten] = (),
        failed_segments: Sequence[str] = (),
    ) -> PutEndReply:
        return self.begin_put_end(keys, checksums, written, failed_segments)()

    def begin_put_end(
        self,
        keys: Sequence[str],
        checksums: Sequence[int],
        written: Sequence[PutWritten] = (),
        failed_segments: Sequence[str] = (),
    ) -> Callable[[], PutEndReply]:
        request = pb.PutEndRequest(
            keys=keys,
            checksums=checksums,
            written=[convert.put_written_to_pb(w) for w in written],
            failed_segments=failed_segments,
        )
        finish = self._begin("PutEnd", request)
        return lambda: convert.put_end_reply_from_pb(finish())

    def reserve(self, client_id: str, client_host: str, size: int) -> Reserved:
        """A region for many small puts. Repeated while no service answers: a region whose
        answer was lost is freed when its grant expires."""
        request = pb.ReserveRequest(client_id=client_id, client_host=client_host, bytes=size)
        return convert.reserved_from_pb(self._call("Reserve", request))

    def put_commit(
        self,
        client_id: str,
        region_id: int,
        keys: Sequence[str],
        offsets: Sequence[int],
        sizes: Sequence[int],
        checksums: Sequence[int],
        released: Sequence[int] = (),
    ) -> list[KeyResult]:
        """Make values written into a region visible; safe to repeat (a key committed already
        answers ALREADY_EXISTS)."""
        request = pb.PutCommitRequest(
            client_id=client_id,
            region_id=region_id,
            keys=keys,
            offsets=offsets,
            sizes=sizes,
            checksums=checksums,
            released=released,
        )
        return convert.key_results_from_pb(self._call("PutCommit", request).results)

    def put_revoke(self, keys: Sequence[str], failed_segments: Sequence[str] = ()) -> list[KeyResult]:
        return self.begin_put_revoke(keys, failed_segments)()

    def begin_put_revoke(
        self, keys: Sequence[str], failed_segments: Sequence[str] = ()
    ) -> Callable[[], list[KeyResult]]:
        finish = self._begin("PutRevoke", pb.PutRevokeRequest(keys=keys, failed_segments=failed_segments))
        return lambda: convert.key_results_from_pb(finish().results)

    def get(
        self,
        keys: Sequence[str],
        released: Sequence[int] = (),
        client_host: str = "",
        client_id: str = "",
        failed_segments: Sequence[str] = (),
        touched: Sequence[str] = (),
    ) -> GetReply:
        """Locations and read leases for `keys`; `touched`: keys the caller read from locations it
        cached, which the service marks recently used first."""
        return self.begin_get(keys, released, client_host, client_id, failed_segments, touched)()

    def begin_get(
        self,
        keys: Sequence[str],
        released: Sequence[int] = (),
        client_host: str = "",
        client_id: str = "",
        failed_segments: Sequence[str] = (),
        touched: Sequence[str] = (),
    ) -> Callable[[], GetReply]:
        request = pb.GetRequest(
            keys=keys,
            released=released,
            client_host=client_host,
            client_id=client_id,
            failed_segments=failed_segments,
            touched=touched,
        )
        finish = self._begin("Get", request)
        return lambda: convert.get_reply_from_pb(finish())

    def remove(
        self, keys: Sequence[str], force: bool = False, released: Sequence[int] = (), client_id: str = ""
    ) -> list[KeyResult]:
        return self.begin_remove(keys, force, released, client_id)()

    def begin_remove(
        self, keys: Sequence[str], force: bool = False, released: Sequence[int] = (), client_id: str = ""
    ) -> Callable[[], list[KeyResult]]:
        finish = self._begin("Remove", pb.RemoveRequest(keys=keys, force=force, released=released, client_id=client_id))
        return lambda: convert.key_results_from_pb(finish().results)

    def pin(self, keys: Sequence[str], ttl_s: float) -> list[KeyResult]:
        response = self._call("Pin", pb.PinRequest(keys=keys, ttl_ms=int(ttl_s * 1000)))
        return convert.key_results_from_pb(response.results)

    def unpin(self, keys: Sequence[str]) -> list[KeyResult]:
        return convert.key_results_from_pb(self._call("Unpin", pb.UnpinRequest(keys=keys)).results)

    def stats(self) -> StoreStats:
        return self.begin_stats()()

    def begin_stats(self) -> Callable[[], StoreStats]:
        finish = self._begin("Stats", pb.StatsRequest())
        return lambda: convert.stats_from_pb(finish())

    # -- daemons' calls ---------------------------------------------------------------------------

    def mount_segment(self, info: SegmentInfo, retry_s: float = 0.0) -> None:
        """Offer a segment (mounting the same segment again changes nothing, so it is retried)."""
        request = pb.MountSegmentRequest(segment=convert.segment_to_pb(info))
        self._call("MountSegment", request, retry_s=retry_s)

    def unmount_segment(self, segment_id: str, timeout_s: float | None = None) -> int:
        """Withdraw a segment; returns how many replicas the service dropped with it."""
        response = self._call("UnmountSegment", pb.UnmountSegmentRequest(segment_id=segment_id), timeout_s)
        return int(response.replicas_dropped)

    def heartbeat(self, daemon_id: str, segment_ids: Sequence[str], timeout_s: float | None = None) -> HeartbeatReply:
        request = pb.HeartbeatRequest(daemon_id=daemon_id, segment_ids=segment_ids)
        return convert.heartbeat_reply_from_pb(self._call("Heartbeat", request, timeout_s))

    def announce_blocks(self, segment_id: str, blocks: Sequence[Block]) -> list[KeyResult]:
        request = pb.AnnounceBlocksRequest(segment_id=segment_id, blocks=convert.blocks_to_pb(blocks))
        return convert.key_results_from_pb(self._call("AnnounceBlocks", request).results)

    def claim_moves(self, daemon_id: str, max_bytes: int, timeout_s: float | None = None) -> list[MoveTask]:
        request = pb.ClaimMovesRequest(daemon_id=daemon_id, max_bytes=max_bytes)
        return [convert.move_from_pb(t) for t in self._call("ClaimMoves", request, timeout_s).tasks]

    def complete_moves(self, daemon_id: str, outcomes: Sequence[MoveOutcome], timeout_s: float | None = None) -> None:
        request = pb.CompleteMovesRequest(daemon_id=daemon_id, results=convert.move_outcomes_to_pb(outcomes))
        self._call("CompleteMoves", request, timeout_s)

    # -- operators' calls (read-only) -------------------------------------------------------------

    def list_keys(self, prefix: str = "", limit: int = 0, cursor: str = "") -> KeyListing:
        """One page of the stored keys starting with `prefix`, in byte order, after `cursor`."""
        request = pb.ListKeysRequest(prefix=prefix, limit=limit, cursor=cursor)
        return listing.listing_from_pb(self._call("ListKeys", request))

    def describe(self, keys: Sequence[str]) -> list[KeyInfo]:
        response = self._call("Describe", pb.DescribeRequest(keys=keys))
        return listing.key_infos_from_pb(keys, list(response.keys))

    # -- tenants (the admin's calls) ---------------------------------------------------------------

    def tenant_add(self, tenant: TenantInfo, update: bool = False, keep_id: bool = False) -> TenantInfo:
        """Make a tenant (AlreadyExists if there is one of that name), or with `update` change one.
        `keep_id`: give it `tenant.id` (a sharded store makes each tenant on every shard alike)."""
        request = pb.TenantAddRequest(tenant=tenant_info.tenant_to_pb(tenant), update=update, keep_id=keep_id)
        return tenant_info.tenant_from_pb(self._call("TenantAdd", request, repeatable=update).tenant)

    def tenant_token(self, name: str, ttl_s: float = 0.0, token: str = "") -> tuple[str, str]:
        """(token id, token): a new token of tenant `name`, good for `ttl_s` (0: until revoked).
        The token is shown only now. `token`: install this one, made by another shard."""
        request = pb.TenantTokenRequest(name=name, ttl_ms=int(ttl_s * 1000), token=token)
        response = self._call("TenantToken", request, repeatable=False)
        return response.token_id, response.token

    def tenant_revoke(self, name: str, token_id: str = "") -> int:
        """Revoke one token of `name` (or all of them); how many were revoked."""
        return int(self._call("TenantRevoke", pb.TenantRevokeRequest(name=name, token_id=token_id)).revoked)

    def tenant_list(self) -> list[TenantInfo]:
        response = self._call("TenantList", pb.TenantListRequest())
        return [tenant_info.tenant_from_pb(t) for t in response.tenants]
