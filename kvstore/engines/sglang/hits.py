"""Which prefix of a span is a hit when a page lives in several pools.

A page is usable only when every pool has what that prefix needs from it, as with kvstore's vLLM
groups (kvstore/engines/vllm/groups.py): a page whose pools are not all stored is no hit. SGLang
states each extra pool's need as a hit policy:

- "all_pages": every page of the prefix (DeepSeek's indexer pool, as the KV itself);
- "trailing_pages": only the last `window` pages before the prefix's end (Mamba state: 1, a
  sliding window: its pages), so a trailing pool can leave holes: a prefix of 5 pages may be
  restorable while 4 is not. Every restorable length is returned: SGLang intersects them across
  ranks.

Any other policy (SGLang's "block_groups") gets no verdict here and gates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

ALL_PAGES = "all_pages"
TRAILING_PAGES = "trailing_pages"


class PoolNeed(NamedTuple):
    name: str
    policy: str  # ALL_PAGES, TRAILING_PAGES, or one without a verdict
    window: int = 1  # TRAILING_PAGES: how many pages before the end


class Hits(NamedTuple):
    kv_hit_pages: int  # the longest restorable prefix
    pool_hit_pages: dict[str, int]  # each pool's own boundary (the KV's under "kv"), where > 0
    restorable: list[int]  # every restorable prefix length, ascending


def leading(present: Sequence[bool]) -> int:
    """How many pages from the start are all present."""
    return next((i for i, p in enumerate(present) if not p), len(present))


def restorable_ends(present: Sequence[bool], kv_pages: int, need: PoolNeed) -> set[int] | None:
    """The prefix lengths in 1..kv_pages this pool can serve; None: no verdict."""
    if need.policy == ALL_PAGES:
        return set(range(1, leading(present[:kv_pages]) + 1))
    if need.policy == TRAILING_PAGES:
        window = max(1, need.window)
        return {end for end in range(1, kv_pages + 1) if all(present[max(0, end - window) : end])}
    return None


def fold(kv_name: str, kv_pages: int, pools: Sequence[tuple[PoolNeed, Sequence[bool]]]) -> Hits:
    """The hit over the KV prefix of `kv_pages` pages and each pool's presence per page."""
    counts = {kv_name: kv_pages} if kv_pages else {}
    ends = set(range(1, kv_pages + 1))
    for need, present in pools:
        if not ends:
            break  # as SGLang's own backends: once nothing is restorable, later pools get no verdict
        served = restorable_ends(present, kv_pages, need)
        if served is None:
            continue
        if served:
            counts[need.name] = max(served)
        ends &= served
    order = sorted(ends)
    return Hits(order[-1] if order else 0, counts, order)
