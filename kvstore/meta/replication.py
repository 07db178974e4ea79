"""Which keys to copy again, and where: a key put with N replicas that has fewer (a replica's
write failed, or its daemon died) gets a copy on a daemon that asks for work, from a replica on
another daemon. Policy only: tiering.py makes the tasks and switches the index."""

from __future__ import annotations

from collections.abc import Iterator

from kvstore.meta.segments import Segment
from kvstore.meta.state import MetaState
from kvstore.types import Tier


def candidates(
    st: MetaState, daemon_id: str, budget: int, now: float, high_watermark: float
) -> Iterator[tuple[str, int, tuple[Segment, int]]]:
    """(key, source location, placed destination) for copies onto `daemon_id`, oldest shortfall
    first, worth up to `budget` bytes; the destination space is reserved as each is yielded.
    A key is skipped while protected (moving, leased, pinned), when the daemon holds one of its
    replicas already, when no source is on a daemon in good standing, or when the copy would push
    the daemon's DRAM past its high watermark (room for new puts comes first)."""
    protected = st.protected(now)
    for key in list(st.under_replicated):
        if budget <= 0:
            return
        entry = st.index.get(key)
        if entry is None:
            st.under_replicated.pop(key, None)
            continue
        if len(entry.replicas()) >= st.under_replicated[key]:
            del st.under_replicated[key]
            continue
        if protected(key):
            continue
        segments = [st.segment_of(loc) for loc in entry.replicas()]
        if any(seg.daemon_id == daemon_id for seg in segments):
            continue
        sources = [
            loc
            for loc, seg in zip(entry.replicas(), segments, strict=True)
            if not st.segments.is_suspect(seg.daemon_id, now)
        ]
        used, capacity = st.usage(Tier.DRAM, daemon_id)
        if not sources or used + entry.size > capacity * high_watermark:
            continue
        placed = st.segments.place_on(daemon_id, Tier.DRAM, entry.size)
        if placed is None:
            continue
        budget -= entry.size
        yield key, sources[0], placed
