"""Every call of the metadata service, said once: its request as a typed value, its reply type,
its fast-lane id, who may make it, whether it is safe to repeat, and how a sharded store splits it.

    meta.call(PutStart(keys, sizes))            # -> PutStartReply
    meta.begin(Get(keys))()                     # sent now, its answer awaited later

Each class is named after its RPC in proto/kvstore/v1/meta.proto; its fields are the request
message's (kvstore.wire.codec maps them, `wire(...)` where a field differs); `reply` says how the
reply value travels. Every layer uses these values: the clients (kvstore.metaclient: one service,
and the sharded store by `fan`), the fast lane's method table (wire.frames), the roles (server.auth)
and the service's handlers (server.handlers: one method per class, `put_start(req, who)`).

Adding a call: the proto messages and rpc (`make proto`), a class here, a handler method, and
what the store does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

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
    ServiceInfoReply,
    StoreStats,
    TenantInfo,
)
from kvstore.types import MoveTask, SegmentInfo
from kvstore.wire import convert, listing, stats, tenant_info
from kvstore.wire.call import NOTHING, Call, Fan, Fields, One, Role, Whole
from kvstore.wire.codec import each, ms, seconds, wire

R = TypeVar("R")


def _key_results() -> One[list[KeyResult]]:
    return One("results", convert.key_results_from_pb, encode=convert.key_results_wire)


# -- the engines' and clients' calls --------------------------------------------------------------


@dataclass(frozen=True)
class ServiceInfo(Call[ServiceInfoReply]):
    """The service's version, fast lane, election and shard map."""

    method_id = 17
    role = Role.ANYONE
    reply = Whole(convert.service_info_to_pb, convert.service_info_from_pb)


@dataclass(frozen=True)
class Exists(Call[list[bool]]):
    method_id = 8
    role = Role.DATA
    reply = One("exists", list)
    fan = Fan.SPLIT
    keyed = ("keys",)
    keys: Sequence[str]


@dataclass(frozen=True)
class MatchPrefix(Call[int]):
    """How many of `keys` (a chain of blocks), from the first, are stored."""

    method_id = 9
    role = Role.DATA
    reply = One("count", int)
    fan = Fan.PREFIX
    keys: Sequence[str]


@dataclass(frozen=True)
class PutStart(Call[PutStartReply]):
    """Never repeated: a PutStart whose answer was lost may have reserved space (the writer
    revokes it)."""

    method_id = 4
    role = Role.DATA
    reply = Whole(convert.put_start_reply_to_pb, convert.put_start_reply_from_pb)
    repeatable = False
    fan = Fan.SPLIT
    keyed = ("keys", "sizes")
    merge = "put_start"
    keys: Sequence[str]
    sizes: Sequence[int]
    replica_num: int = 1
    client_host: str = ""


@dataclass(frozen=True)
class PutEnd(Call[PutEndReply]):
    method_id = 5
    role = Role.DATA
    reply = Whole(convert.put_end_reply_to_pb, convert.put_end_reply_from_pb)
    fan = Fan.SPLIT
    keyed = ("keys", "checksums", "written")
    merge = "put_end"
    keys: Sequence[str]
    checksums: Sequence[int]
    written: Sequence[PutWritten] = field(
        default=(), metadata=wire(to=each(convert.put_written_to_pb), back=each(convert.put_written_from_pb))
    )
    failed_segments: Sequence[str] = ()


@dataclass(frozen=True)
class PutRevoke(Call[list[KeyResult]]):
    method_id = 6
    role = Role.DATA
    reply = _key_results()
    fan = Fan.SPLIT
    keyed = ("keys",)
    keys: Sequence[str]
    failed_segments: Sequence[str] = ()


@dataclass(frozen=True)
class Reserve(Call[Reserved]):
    """A region for many small puts. Repeated while no service answers: a region whose answer
    was lost is freed when its grant expires."""

    method_id = 24
    role = Role.DATA
    reply = Whole(convert.reserved_to_pb, convert.reserved_from_pb)
    client_id: str
    client_host: str
    size: int = field(metadata=wire("bytes"))


@dataclass(frozen=True)
class PutCommit(Call[list[KeyResult]]):
    """Make values written into a region visible; safe to repeat (a key committed already
    answers ALREADY_EXISTS)."""

    method_id = 25
    role = Role.DATA
    reply = _key_results()
    client_id: str
    region_id: int
    keys: Sequence[str]
    offsets: Sequence[int]
    sizes: Sequence[int]
    checksums: Sequence[int]
    released: Sequence[int] = ()


@dataclass(frozen=True)
class Get(Call[GetReply]):
    """Locations and read leases for `keys`. `released`: leases handed back; `touched`: keys the
    caller read from locations it cached, which the service marks recently used first. A Get of no
    keys only hands back and touches."""

    method_id = 7
    role = Role.DATA
    reply = Whole(convert.get_reply_to_pb, convert.get_reply_from_pb)
    fan = Fan.SPLIT
    keyed = ("keys",)
    merge = "get"
    leases = True
    hints = True
    keys: Sequence[str]
    released: Sequence[int] = ()
    client_host: str = ""
    client_id: str = ""
    failed_segments: Sequence[str] = ()
    touched: Sequence[str] = ()
    packed: int = 0  # how the reply travels: kvstore.wire.packed (MESSAGES, COLUMNS, ROWS)


@dataclass(frozen=True)
class Release(Call[None]):
    """Hand read leases back: each goes to the shard that granted it."""

    method_id = 26
    role = Role.DATA
    reply = NOTHING
    fan = Fan.SPLIT
    merge = "none"
    leases = True
    released: Sequence[int] = ()
    client_id: str = ""


@dataclass(frozen=True)
class Remove(Call[list[KeyResult]]):
    method_id = 10
    role = Role.DATA
    reply = _key_results()
    fan = Fan.SPLIT
    keyed = ("keys",)
    leases = True
    keys: Sequence[str]
    force: bool = False
    released: Sequence[int] = ()
    client_id: str = ""


@dataclass(frozen=True)
class Pin(Call[list[KeyResult]]):
    method_id = 11
    role = Role.DATA
    reply = _key_results()
    fan = Fan.SPLIT
    keyed = ("keys",)
    keys: Sequence[str]
    ttl_s: float = field(metadata=wire("ttl_ms", to=ms, back=seconds))


@dataclass(frozen=True)
class Unpin(Call[list[KeyResult]]):
    method_id = 12
    role = Role.DATA
    reply = _key_results()
    fan = Fan.SPLIT
    keyed = ("keys",)
    keys: Sequence[str]


@dataclass(frozen=True)
class Stats(Call[StoreStats]):
    method_id = 16
    role = Role.ANYONE
    reply = Whole(stats.stats_to_pb, stats.stats_from_pb)
    fan = Fan.EVERY
    merge = "stats"


@dataclass(frozen=True)
class ListKeys(Call[KeyListing]):
    """One page of the stored keys starting with `prefix`, in byte order, after `cursor`."""

    method_id = 18
    role = Role.DATA
    reply = Whole(listing.listing_to_pb, listing.listing_from_pb)
    fan = Fan.EVERY
    merge = "pages"
    prefix: str = ""
    limit: int = 0
    cursor: str = ""


@dataclass(frozen=True)
class Describe(Call[list[KeyInfo]]):
    method_id = 19
    role = Role.DATA
    reply = One("keys", lambda msgs, call: listing.key_infos_from_pb(call.keys, list(msgs)),
                each(listing.key_info_to_pb), of_call=True)  # fmt: skip
    fan = Fan.SPLIT
    keyed = ("keys",)
    keys: Sequence[str]


# -- the daemons' calls -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MountSegment(Call[None]):
    """Offer a segment (mounting the same segment again changes nothing: safe to repeat)."""

    method_id = 1
    role = Role.DAEMON
    reply = NOTHING
    segment: SegmentInfo = field(metadata=wire(to=convert.segment_to_pb, back=convert.segment_from_pb))


@dataclass(frozen=True)
class UnmountSegment(Call[int]):
    """Withdraw a segment; how many replicas the service dropped with it."""

    method_id = 2
    role = Role.DAEMON
    reply = One("replicas_dropped", int)
    segment_id: str


@dataclass(frozen=True)
class Heartbeat(Call[HeartbeatReply]):
    method_id = 3
    role = Role.DAEMON
    reply = Whole(convert.heartbeat_reply_to_pb, convert.heartbeat_reply_from_pb)
    daemon_id: str
    segment_ids: Sequence[str]


@dataclass(frozen=True)
class ClaimMoves(Call[list[MoveTask]]):
    method_id = 13
    role = Role.DAEMON
    reply = One("tasks", each(convert.move_from_pb), each(convert.move_to_pb))
    daemon_id: str
    max_bytes: int


@dataclass(frozen=True)
class CompleteMoves(Call[None]):
    method_id = 14
    role = Role.DAEMON
    reply = NOTHING
    daemon_id: str
    outcomes: Sequence[MoveOutcome] = field(
        metadata=wire("results", to=convert.move_outcomes_to_pb, back=convert.move_outcomes_from_pb)
    )


@dataclass(frozen=True)
class AnnounceBlocks(Call[list[KeyResult]]):
    method_id = 15
    role = Role.DAEMON
    reply = _key_results()
    segment_id: str
    blocks: Sequence[Block] = field(metadata=wire(to=convert.blocks_to_pb, back=convert.blocks_from_pb))


# -- tenants (the admin's calls), made on every shard -------------------------------------------------


@dataclass(frozen=True)
class TenantAdd(Call[TenantInfo]):
    """Make a tenant (AlreadyExists if there is one of that name), or with `update` change one.
    `keep_id`: give it `tenant.id` (a sharded store makes each tenant on every shard alike, each
    with its share of the quotas and reserves)."""

    method_id = 20
    role = Role.ADMIN
    reply = One("tenant", tenant_info.tenant_from_pb, tenant_info.tenant_to_pb)
    fan = Fan.TENANTS
    tenant: TenantInfo = field(metadata=wire(to=tenant_info.tenant_to_pb, back=tenant_info.tenant_from_pb))
    update: bool = False
    keep_id: bool = False

    def is_repeatable(self) -> bool:
        return self.update

    def first(self, shards: int) -> TenantAdd:
        return replace(self, tenant=self.tenant.share(shards))

    def then(self, first: TenantInfo) -> TenantAdd:
        return replace(self, tenant=replace(self.tenant, id=first.id), keep_id=True)

    def again(self) -> TenantAdd:
        return replace(self, update=not self.update)

    def joined(self, first: TenantInfo) -> TenantInfo:
        return replace(first, quotas=self.tenant.quotas, reserved=self.tenant.reserved)


@dataclass(frozen=True)
class TenantToken(Call[tuple[str, str]]):
    """(token id, token): a new token of tenant `name`, good for `ttl_s` (0: until revoked), shown
    only now. `token`: install this one, made by another shard."""

    method_id = 21
    role = Role.ADMIN
    reply = Fields(("token_id", "token"))
    repeatable = False
    fan = Fan.TENANTS
    name: str
    ttl_s: float = field(default=0.0, metadata=wire("ttl_ms", to=ms, back=seconds))
    token: str = ""

    def then(self, first: tuple[str, str]) -> TenantToken:
        return replace(self, token=first[1])


@dataclass(frozen=True)
class TenantRevoke(Call[int]):
    """Revoke one token of `name` (or all of them); how many were revoked."""

    method_id = 22
    role = Role.ADMIN
    reply = One("revoked", int)
    fan = Fan.TENANTS
    name: str
    token_id: str = ""


@dataclass(frozen=True)
class TenantList(Call[list[TenantInfo]]):
    method_id = 23
    role = Role.ADMIN
    reply = One("tenants", each(tenant_info.tenant_from_pb), each(tenant_info.tenant_to_pb))
    fan = Fan.EVERY
    merge = "tenants"


# Every call by its RPC's name.
CALLS: dict[str, type[Call[Any]]] = {c.rpc: c for c in Call.__subclasses__()}
