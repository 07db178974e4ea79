"""Looking keys up for operators: listing (ListKeys) and describing (Describe) them. Read-only,
under the store's lock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.meta.index import ObjectIndex
from kvstore.meta.state import MetaState
from kvstore.results import KeyInfo, KeyListing, KeyState, ReplicaInfo
from kvstore.types import MAX_BATCH_KEYS

DEFAULT_LIMIT = 1000


def list_page(
    index: ObjectIndex,
    prefix: str,
    limit: int,
    cursor: str,
    hidden: str,
    sliced: Callable[[int, Callable[[range, float], list[Any]]], list[Any]],
) -> KeyListing:
    """MetaStore.list_keys: the page from the index's byte order, then its sizes (each step under
    the lock through `sliced`; the page costs O(log n + its keys), never a walk of every key)."""
    limit = limit or DEFAULT_LIMIT
    if not 0 < limit <= MAX_BATCH_KEYS:
        raise InvalidArgument(f"limit {limit} must be between 1 and {MAX_BATCH_KEYS}")
    [(found, more)] = sliced(1, lambda part, now: [index.orders.page(prefix, cursor, limit, hidden)])
    get = index.get
    sizes = sliced(len(found), lambda part, now: [(found[i], get(found[i])) for i in part])
    kept = [(k, e.size) for k, e in sizes if e is not None]  # removed between the two steps: left out
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
