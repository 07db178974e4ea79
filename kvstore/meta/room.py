"""Making room in DRAM for one put, under the store's lock.

Eviction frees only what the put needs, and only where the put can use it: victims come from
the daemons the block may be placed on, in the policy's order, and the loop stops once the block
is placed. An evicted block whose space cannot be reused yet (a daemon-checked grant over it is
still live, so its space waits in quarantine) counts as room on its way back: once that covers
the put, nothing more is evicted and the put is told when the space comes due (`retry_after_s`),
rather than evicting on and on for space that is not free yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.meta import quotas
from kvstore.meta.eviction import EvictionPolicy
from kvstore.meta.index import SegmentRecency
from kvstore.meta.segments import Segment
from kvstore.meta.state import MetaState
from kvstore.types import Tier

MIN_RETRY_S = 0.01


@dataclass(frozen=True)
class Room:
    """A placement, or none; with none, `retry_after_s` > 0 says when room comes due."""

    placed: list[tuple[Segment, int]] = field(default_factory=list)
    retry_after_s: float = 0.0


def make_room(
    st: MetaState,
    policy: EvictionPolicy,
    size: int,
    replica_num: int,
    now: float,
    tenant: int,
    daemons: frozenset[str],
    suspects: bool,
) -> Room:
    """Evict from `daemons`' DRAM what placing `replica_num` copies of `size` bytes needs, and place
    them (on suspected daemons too if `suspects`)."""
    numbers = {s.number for s in st.segments.segments(Tier.DRAM) if s.daemon_id in daemons}
    if not numbers:
        return Room()
    need = size * replica_num
    candidates = quotas.sparing_reserves(st, st.protected(now), Tier.DRAM, tenant)
    while (short := need - st.returning(numbers)[0]) > 0:
        victims = policy.victims(SegmentRecency(st.index, numbers), candidates, short)
        if not victims:
            break
        st.evict(victims, now)
        placed = st.segments.place(size, replica_num, Tier.DRAM, now, suspects=suspects)
        if placed:
            return Room(placed)
    returning, due = st.returning(numbers)
    if returning:
        return Room(retry_after_s=max(due - now, MIN_RETRY_S))
    return Room()
