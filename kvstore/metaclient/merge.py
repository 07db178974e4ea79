"""How a sharded client fans a batch out to its shards and puts their answers together again
(kvstore/metaclient/sharded.py): per-key results back in the caller's order, stats and tenants added."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kvstore import shards
from kvstore.errors import InvalidArgument, Unavailable, WrongShard
from kvstore.metaclient.client import MetaClient
from kvstore.results import (
    GetReply,
    GetResult,
    KeyListing,
    KeyResult,
    PutEndReply,
    PutStartReply,
    PutStartResult,
    StoreStats,
    TenantInfo,
)
from kvstore.types import SegmentInfo, Tier
from kvstore.wire.call import Call

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C", bound="Call[Any]")


def fan(
    cs: list[MetaClient],
    keys: Sequence[str],
    begin: Callable[[list[MetaClient], int, list[int]], Callable[[], T]],
    merge: Callable[[int, Iterable[tuple[list[int], T]]], T],
    refresh: Callable[[WrongShard], list[MetaClient]] | None = None,
) -> T:
    """Send each shard its keys' call (`begin(clients, shard, positions)`), then wait for all: one
    round trip for the batch. Keys a shard refused as not its own (WRONG_SHARD: the map changed)
    are sent once more over the map `refresh` reads; the parts other shards answered are not sent
    again (their calls took effect)."""
    done: list[tuple[list[int], T]] = []
    todo = list(range(len(keys)))
    while True:
        pending = [(idx, begin(cs, shard, idx)) for shard, idx in _parts(keys, todo, len(cs)).items()]
        failure: BaseException | None = None
        refused: WrongShard | None = None
        wrong: list[int] = []
        for idx, finish in pending:  # every answer is read, even after a failure: the lanes stay in step
            try:
                done.append((idx, finish()))
            except WrongShard as exc:
                refused = exc
                wrong += idx
            except Exception as exc:  # noqa: BLE001 - re-raised below, once every answer is in
                failure = failure or exc
        if failure is not None:
            raise failure
        if refused is None:
            return merge(len(keys), done)
        if refresh is None:
            raise refused
        cs, todo, refresh = refresh(refused), sorted(wrong), None  # once: a map that is wrong again is an error


def _parts(keys: Sequence[str], todo: list[int], count: int) -> dict[int, list[int]]:
    """The positions `todo` of `keys`, by the shard that owns each."""
    if count == 1:
        return {0: todo} if todo else {}
    return {shard: [todo[j] for j in sub] for shard, sub in shards.split(pick(keys, todo), count).items()}


def same_length(keys: Sequence[str], values: Sequence[Any], what: str) -> None:
    if len(values) != len(keys):
        raise InvalidArgument(f"{len(keys)} keys but {len(values)} {what}: give one per key")


def pick(values: Sequence[T], idx: list[int]) -> list[T]:
    return [values[i] for i in idx]


def place(out: list[Any], idx: list[int], values: Sequence[Any]) -> None:
    if len(values) != len(idx):
        raise Unavailable(f"a shard answered {len(values)} results for {len(idx)} keys")
    for i, v in zip(idx, values):
        out[i] = v


def keys_of(req: Call[Any]) -> Sequence[str]:
    """The keys a call names (none for a call of leases alone)."""
    keys: Sequence[str] = req.value("keys", ())
    return keys


def check_keyed(req: Call[Any]) -> None:
    """Every field with one item per key has as many as there are keys (an optional one, left
    empty, may have none)."""
    keys = keys_of(req)
    optional = {f.name for f in dataclasses.fields(req) if f.default != dataclasses.MISSING}
    for name in req.keyed:
        values = req.value(name)
        if name != "keys" and (values or name not in optional):
            same_length(keys, values, name)


def part(req: C, idx: list[int]) -> C:
    """`req` for the keys at positions `idx` (and the items of its keyed fields there)."""
    return replace(req, **{name: pick(v, idx) if (v := req.value(name)) else v for name in req.keyed})


Merge = Callable[[Any, int, Iterable[tuple[list[int], Any]]], Any]


def merge_of(req: Call[R]) -> Callable[[Call[R], int, Iterable[tuple[list[int], R]]], R]:
    """How the shards' answers to `req` become one (its class's `merge`)."""
    return MERGES[req.merge]


def concat(n: int, parts: Iterable[tuple[list[int], Sequence[T]]]) -> list[T]:
    out: list[Any] = [None] * n
    for idx, values in parts:
        place(out, idx, values)
    return out


def merge_put_starts(n: int, parts: Iterable[tuple[list[int], PutStartReply]]) -> PutStartReply:
    results: list[PutStartResult] = [PutStartResult()] * n
    segments: dict[str, SegmentInfo] = {}
    for idx, reply in parts:
        place(results, idx, reply.results)
        segments.update(reply.segments)
    return PutStartReply(tuple(results), segments)


def merge_put_ends(n: int, parts: Iterable[tuple[list[int], PutEndReply]]) -> PutEndReply:
    results: list[KeyResult] = [KeyResult()] * n
    replicas = [0] * n
    for idx, reply in parts:
        place(results, idx, reply.results)
        place(replicas, idx, reply.replicas or [0] * len(idx))
    return PutEndReply(tuple(results), tuple(replicas))


def merge_gets(n: int, parts: Iterable[tuple[list[int], GetReply]]) -> GetReply:
    results: list[GetResult] = [GetResult()] * n
    segments: dict[str, SegmentInfo] = {}
    lease_ms = 0
    for idx, reply in parts:
        place(results, idx, reply.results)
        segments.update(reply.segments)
        lease_ms = min(lease_ms, reply.lease_ms) if lease_ms else reply.lease_ms
    return GetReply(tuple(results), segments, lease_ms)


def add_stats(per_shard: list[StoreStats]) -> StoreStats:
    """The store's figures: the shards' added (tiers by tier), each shard's kept in `per_shard`."""
    first = per_shard[0]
    tiers: dict[Tier, Any] = {}
    for s in per_shard:
        for t in s.tiers:
            old = tiers.get(t.tier)
            tiers[t.tier] = (
                t
                if old is None
                else replace(
                    old,
                    **{f: getattr(old, f) + getattr(t, f) for f in ("capacity", "used", "blocks", "hits", "evictions")},
                    demotions=old.demotions + t.demotions,
                    promotions=old.promotions + t.promotions,
                )
            )
    daemons: dict[str, Any] = {}
    for s in per_shard:  # a daemon offers every shard its slice: one daemon, its slices' segments
        for d in s.daemons:
            old = daemons.get(d.daemon_id)
            daemons[d.daemon_id] = (
                d
                if old is None
                else replace(
                    old,
                    segments=old.segments + d.segments,
                    used=old.used + d.used,
                    last_heartbeat=max(old.last_heartbeat, d.last_heartbeat),
                )
            )
    total = {
        f: sum(getattr(s, f) for s in per_shard)
        for f in (
            "keys",
            "pending",
            "capacity",
            "used",
            "evictions",
            "revoked_puts",
            "leased",
            "pinned",
            "under_replicated",
            "quarantined_bytes",
            "reconciling",
        )
    }
    return replace(
        first,
        **total,
        tiers=tuple(tiers[t] for t in sorted(tiers, key=lambda t: t.value)),
        daemons=tuple(daemons.values()),
        writes_open=all(s.writes_open for s in per_shard),
        shard=0,
        shards=len(per_shard),
        per_shard=tuple(per_shard),
    )


def sum_tiers(tables: Iterable[dict[Tier, int]]) -> dict[Tier, int]:
    out: dict[Tier, int] = {}
    for table in tables:
        for t, n in table.items():
            out[t] = out.get(t, 0) + n
    return out


def merge_pages(pages: Sequence[KeyListing], limit: int) -> KeyListing:
    """The shards' pages of one listing merged in byte order: the first `limit` of all of them."""
    rows = sorted((k, s) for page in pages for k, s in zip(page.keys, page.sizes))
    more = any(page.next_cursor for page in pages)
    if limit and len(rows) > limit:
        rows, more = rows[:limit], True
    keys = tuple(k for k, _ in rows)
    return KeyListing(keys, tuple(s for _, s in rows), keys[-1] if more and keys else "")


def merge_tenants(lists: Sequence[Sequence[TenantInfo]]) -> list[TenantInfo]:
    """Each shard's list of the tenants: one entry per tenant, its shares added up."""
    out = []
    for first in lists[0]:
        same = [t for tl in lists for t in tl if t.name == first.name]
        out.append(
            replace(
                first,
                quotas=sum_tiers(t.quotas for t in same),
                reserved=sum_tiers(t.reserved for t in same),
                used=sum_tiers(t.used for t in same),
                keys=sum(t.keys for t in same),
            )
        )
    return out


MERGES: dict[str, Merge] = {
    "concat": lambda req, n, parts: concat(n, parts),
    "none": lambda req, n, parts: None,
    "put_start": lambda req, n, parts: merge_put_starts(n, parts),
    "put_end": lambda req, n, parts: merge_put_ends(n, parts),
    "get": lambda req, n, parts: merge_gets(n, parts),
    "stats": lambda req, n, parts: add_stats([reply for _, reply in parts]),
    "pages": lambda req, n, parts: merge_pages([reply for _, reply in parts], req.limit),
    "tenants": lambda req, n, parts: merge_tenants([reply for _, reply in parts]),
}
