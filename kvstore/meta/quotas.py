"""Quotas and reserved shares: what one tenant may hold, and what others may not take from it.

A tenant's bytes in a tier are its replicas there (MetaState.tenants.usage) plus what its puts
in progress hold (counted against every tier they may land in: a put does not know its tier
until it is placed). A put that would pass the quota first evicts the tenant's own least
recently used blocks in that tier (if its policy says so); if that cannot make room it is
refused with QUOTA_EXCEEDED. Eviction for room, by any other cause (another tenant's put, a
watermark, a full SSD), skips a tenant's blocks once taking them would leave it below its
reserved bytes in the tier: one tenant's put storm cannot push another below its share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from kvstore.meta.eviction import EvictionPolicy
from kvstore.meta.index import TenantRecency
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import tenant_of
from kvstore.types import Tier

NOBODY = -1  # eviction no tenant asked for (watermarks, demotion)


def held(st: MetaState, tenant: int, tier: Tier) -> int:
    return st.tenants.usage[tenant, tier] + st.index.tenant_pending[tenant]


def over(st: MetaState, tenant: int, tier: Tier, need: int) -> int:
    """Bytes by which holding `need` more in `tier` passes the tenant's quota (0: within it)."""
    t = st.tenants.by_id(tenant)
    quota = t.quotas.get(tier) if t is not None else None
    return 0 if quota is None else max(0, held(st, tenant, tier) + need - quota)


def make_room(st: MetaState, policy: EvictionPolicy, tenant: int, tier: Tier, need: int, now: float) -> str:
    """Bring the tenant within its quota for `need` more bytes in `tier`, evicting its own least
    recently used blocks there if its policy allows; "" when it fits, else why it does not."""
    excess = over(st, tenant, tier, need)
    if not excess:
        return ""
    t = st.tenants.by_id(tenant)
    assert t is not None
    why = (
        f"tenant {t.name!r} holds {held(st, tenant, tier)} bytes of its {t.quotas[tier]}-byte {tier.value} "
        f"quota; {need} more do not fit"
    )
    if not t.evict_own:
        return why + " (it is refused over quota: remove keys, or raise the quota)"
    protected = st.protected(now)
    in_tier = {s.number for s in st.segments.segments(tier)}

    def not_own(key: str) -> bool:
        entry = st.index.get(key)
        return (
            tenant_of(key) != tenant
            or protected(key)
            or entry is None
            or not any(st.segment_of(loc).number in in_tier for loc in entry.replicas())
        )

    victims = policy.victims(TenantRecency(st.index, tenant), not_own, excess)  # its own keys only
    freed = sum(
        e.size * sum(st.segment_of(loc).number in in_tier for loc in e.replicas())
        for k in victims
        if (e := st.index.get(k)) is not None
    )
    if freed < excess:
        return why + " even after evicting its own unleased, unpinned blocks"
    st.evict(victims, now)
    return "" if not over(st, tenant, tier, need) else why


def sparing_reserves(
    st: MetaState, skip: Callable[[str], bool], tier: Tier, requester: int = NOBODY
) -> Callable[[str], bool]:
    """`skip` for an eviction of `tier`'s blocks, also sparing blocks of tenants (other than the
    one asking) that taking would leave below their reserved bytes there. Counts what it lets
    through: an EvictionPolicy takes every candidate it is not told to skip."""
    if not any(t.reserved.get(tier) for t in st.tenants.all()):
        return skip
    taken: Counter[int] = Counter()

    def guarded(key: str) -> bool:
        if skip(key):
            return True
        owner = tenant_of(key)
        t = st.tenants.by_id(owner)
        reserve = t.reserved.get(tier, 0) if t is not None and owner != requester else 0
        if reserve:
            entry = st.index.get(key)
            size = entry.size if entry is not None else 0
            if st.tenants.usage[owner, tier] - taken[owner] - size < reserve:
                return True
            taken[owner] += size
        return False

    return guarded
