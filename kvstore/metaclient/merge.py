"""How a sharded client fans a batch out to its shards and puts their answers together again
(kvstore/metaclient/sharded.py): per-key results back in the caller's order, stats and tenants added."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kvstore import shards
from kvstore.errors import InvalidArgument, Unavailable, WrongShard
from kvstore.metaclient.client import MetaClient
from kvstore.results import GetReply, GetResult, KeyListing, StoreStats, TenantInfo
from kvstore.types import SegmentInfo, Tier

T = TypeVar("T")


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


def serially(
    cs: list[MetaClient], keys: Sequence[str], call: Callable[[MetaClient, list[str]], Sequence[T]]
) -> list[T]:
    out: list[Any] = [None] * len(keys)
    for shard, idx in shards.split(keys, len(cs)).items():
        place(out, idx, call(cs[shard], pick(keys, idx)))
    return out


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


def concat(n: int, parts: Iterable[tuple[list[int], Sequence[T]]]) -> list[T]:
    out: list[Any] = [None] * n
    for idx, values in parts:
        place(out, idx, values)
    return out


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


def split_bytes(tenant: TenantInfo, count: int) -> TenantInfo:
    """Each shard's share of a tenant's quotas and reserves (rounded up: no share is 0)."""
    return replace(
        tenant,
        quotas={t: -(-n // count) for t, n in tenant.quotas.items()},
        reserved={t: -(-n // count) for t, n in tenant.reserved.items()},
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
