"""The tenant calls on the metadata state (under the store's lock): adding and changing tenants,
their tokens, listing them with what they hold, and the statistics one tenant may see."""

from __future__ import annotations

from kvstore.meta.state import MetaState
from kvstore.meta.tenants import DEFAULT_ID, Tenant
from kvstore.results import StoreStats, TenantInfo, TierStats
from kvstore.types import Tier


def keys_of(st: MetaState, tenant_id: int) -> int:
    if tenant_id != DEFAULT_ID:
        return st.index.tenant_keys[tenant_id]
    return len(st.index) - sum(st.index.tenant_keys.values())


def info(st: MetaState, t: Tenant) -> TenantInfo:
    """What the admin sees of tenant `t`: its settings, token ids, and what it holds."""
    used = {tier: st.tenants.usage[t.id, tier] for tier in Tier if st.tenants.usage[t.id, tier]}
    tokens = tuple(sorted(((i, k.created, k.expires) for i, k in t.tokens.items()), key=lambda x: x[1]))
    return TenantInfo(
        t.name,
        t.id,
        dict(t.quotas),
        dict(t.reserved),
        t.evict_own,
        t.trust_shm,
        t.admin,
        tokens,
        used,
        keys_of(st, t.id),
    )


def spec(info: TenantInfo) -> Tenant:
    """The settings of a TenantAdd as a Tenant (tokens are the registry's to give, and the id too
    unless the call keeps the one it names)."""
    quotas, reserved = dict(info.quotas), dict(info.reserved)
    return Tenant(info.name, info.id, quotas, reserved, info.evict_own, info.trust_shm, info.admin)


def stats_of(st: MetaState, tenant: Tenant) -> StoreStats:
    """What tenant `tenant` may see: its own keys, blocks and bytes per tier, each tier's capacity
    its quota (0: none). No counters of hits, evictions or moves, which others' calls move too."""
    tiers = []
    for tier in Tier:
        capacity = st.usage(tier)[1]
        blocks, used = st.tenants.blocks[tenant.id, tier], st.tenants.usage[tenant.id, tier]
        if capacity or blocks:
            tiers.append(TierStats(tier, tenant.quotas.get(tier, 0), used, blocks))
    return StoreStats(
        keys=keys_of(st, tenant.id),
        pending=0,
        capacity=sum(t.capacity for t in tiers),
        used=sum(t.used for t in tiers),
        evictions=0,
        revoked_puts=0,
        leased=0,
        tiers=tuple(tiers),
        tenant=tenant.name,
    )
