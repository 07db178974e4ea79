"""Looking keys up for operators: listing (ListKeys) and describing (Describe) them. Read-only;
called under the store's lock, except `page`, which works on a snapshot of the keys."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.meta.index import ObjectIndex
from kvstore.meta.state import MetaState
from kvstore.results import KeyInfo, KeyListing, KeyState, ReplicaInfo
from kvstore.types import MAX_BATCH_KEYS

DEFAULT_LIMIT = 1000


def complete_keys(st: MetaState) -> list[str]:
    """A snapshot of every COMPLETE key, taken in one C-level pass (milliseconds per million keys)."""
    return list(map(itemgetter(0), st.index.least_recent()))


def page(keys: Sequence[str], prefix: str, cursor: str, limit: int, hidden: str = "") -> tuple[list[str], bool]:
    """The first `limit` keys in byte order that start with `prefix`, not with `hidden` (when
    given), and sort after `cursor`, and whether more follow. Needs no lock: `keys` is a snapshot."""
    matching: Iterable[str] = keys
    if prefix or cursor:
        matching = (k for k in matching if k > cursor and k.startswith(prefix))
    if hidden:
        matching = (k for k in matching if not k.startswith(hidden))
    first = heapq.nsmallest(limit + 1, matching)
    return first[:limit], len(first) > limit


def list_page(
    index: ObjectIndex,
    keys: Sequence[str],
    prefix: str,
    limit: int,
    cursor: str,
    hidden: str,
    sliced: Callable[[int, Callable[[range, float], list[Any]]], list[Any]],
) -> KeyListing:
    """MetaStore.list_keys over a snapshot `keys`; `sliced` reads the page's sizes under the lock."""
    limit = limit or DEFAULT_LIMIT
    if not 0 < limit <= MAX_BATCH_KEYS:
        raise InvalidArgument(f"limit {limit} must be between 1 and {MAX_BATCH_KEYS}")
    found, more = page(keys, prefix, cursor, limit, hidden)
    get = index.get
    sizes = sliced(len(found), lambda part, now: [(found[i], get(found[i])) for i in part])
    kept = [(k, e.size) for k, e in sizes if e is not None]  # removed since the snapshot: left out
    next_cursor = found[-1] if more and found else ""
    return KeyListing(tuple(k for k, _ in kept), tuple(n for _, n in kept), next_cursor)


def describe(st: MetaState, key: str, now: float) -> KeyInfo:
    """What the index, leases, pins and moves say of `key` at `now`."""
    entry = st.index.get(key)
    if entry is not None:
        locations, size, checksum, state = entry.replicas(), entry.size, entry.checksum, KeyState.COMPLETE
    elif (put := st.index.get_pending(key)) is not None:
        locations, size, checksum, state = st.live(put.locations), put.size, 0, KeyState.PENDING
    else:
        return KeyInfo(key, KeyState.ABSENT)
    replicas = []
    for loc in locations:
        seg = st.segment_of(loc)
        replicas.append(ReplicaInfo(seg.segment_id, seg.daemon_id, seg.info.tier))
    return KeyInfo(
        key,
        state,
        size,
        checksum,
        tuple(replicas),
        st.under_replicated.get(key, 0),
        max(0.0, st.leases.until(key) - now),
        max(0.0, st.pins.until(key) - now),
        key in st.moving,
    )
