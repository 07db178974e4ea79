"""Soft pins: a client keeps COMPLETE keys (a shared system prompt, say) from eviction and moves
for a while. Pinned bytes are capped per tier, so pins can never leave eviction nothing to take.
Acts on the metadata state under the store's lock, like the tiering logic."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.errors import ErrorCode
from kvstore.meta.state import MetaState
from kvstore.results import OK, KeyResult
from kvstore.types import Tier


def pin(st: MetaState, keys: Sequence[str], ttl_s: float, cap: float, now: float) -> list[KeyResult]:
    """Pin each key until now + ttl_s; NO_SPACE for a key whose tiers' pins would pass `cap` of
    their capacity (re-pinning a pinned key only extends it)."""
    st.pins.expire(now)
    pinned = _pinned_bytes(st)
    results = []
    for key in keys:
        entry = st.index.get(key)
        if entry is None:
            results.append(KeyResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not stored; put it first"))
            continue
        tiers = [st.tier_of(loc) for loc in entry.replicas()]
        if not st.pins.held(key, now):
            over = [t for t in tiers if pinned.get(t, 0) + entry.size > cap * st.usage(t)[1]]
            if over:
                results.append(
                    KeyResult(
                        ErrorCode.NO_SPACE,
                        f"pins on tier {over[0].value} would pass {cap:.0%} of its capacity; unpin something",
                    )
                )
                continue
            for t in tiers:
                pinned[t] = pinned.get(t, 0) + entry.size
        st.pins.hold(key, now + ttl_s)
        if st.tracking:
            st.changed_pins.add(key)
        results.append(OK)
    return results


def unpin(st: MetaState, keys: Sequence[str]) -> list[KeyResult]:
    results = []
    for key in keys:
        held = key in st.pins
        st.pins.release(key)
        if held and st.tracking:
            st.changed_pins.add(key)
        results.append(OK if held else KeyResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not pinned"))
    return results


def _pinned_bytes(st: MetaState) -> dict[Tier, int]:
    total: dict[Tier, int] = {}
    for key in st.pins:
        entry = st.index.get(key)
        if entry is None:
            continue
        for loc in entry.replicas():
            tier = st.tier_of(loc)
            total[tier] = total.get(tier, 0) + entry.size
    return total
