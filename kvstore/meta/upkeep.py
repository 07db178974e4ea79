"""The metadata service's periodic upkeep, under the store's lock: what time alone changes.

Expired puts are revoked, leases and pins end, quarantined space that came due is freed, stale
moves are abandoned, daemons silent past their TTL have their segments set aside (dropped if
they stay silent), segments loaded after a takeover and never mounted again are set aside the
same way, and DRAM (and GPU, SSD) is evicted back under its watermarks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvstore.config import MetaConfig
from kvstore.meta import quotas
from kvstore.meta.eviction import EvictionPolicy
from kvstore.meta.index import SegmentRecency
from kvstore.meta.state import MetaState
from kvstore.meta.tiering import Tiering
from kvstore.types import Tier

log = logging.getLogger(__name__)


def expire(st: MetaState, tiering: Tiering, config: MetaConfig, now: float) -> None:
    """What ran out by `now` (wall clock: leases, grants and puts expire by it)."""
    for key in st.index.expired_puts(now - st.quarantine.grace):
        log.warning("revoking put of %r: not ended within its %.1f s put lease", key, config.put_lease_ttl_s)
        st.revoke(key, now)
    st.leases.expire(now)
    st.pins.expire(now)
    st.expire(now)
    tiering.expire(now)


def drop_silent(st: MetaState, config: MetaConfig, mono: float, unmount: Callable[[str], int]) -> None:
    """Daemons that have not heartbeated within heartbeat_ttl_s (monotonic) have their DRAM and GPU
    segments set aside: kept with their replicas, nothing read from or placed in them, until the
    daemon mounts them again (a partition healed: every acknowledged put there is back) or
    silent_grace_s passes (the daemon is gone: they are dropped). SSD segments are dropped at once
    (unmount: SsdForgets.unmount, so their replicas are dropped, not deleted): the daemon's journal
    announces what they hold when it mounts them again."""
    for daemon in st.segments.silent_daemons(mono, config.heartbeat_ttl_s):
        segs = [seg for s in sorted(daemon.segment_ids) if (seg := st.segments.get(s)) is not None]
        kept = {seg.segment_id for seg in segs if seg.info.tier is not Tier.SSD and config.silent_grace_s > 0}
        if any(seg.confirmed for seg in segs):
            log.warning(
                "daemon %s silent for %.1f s: %d segments set aside until it mounts them again (dropped in %.0f s), "
                "%d dropped",
                daemon.daemon_id,
                mono - daemon.last_heartbeat,
                len(kept),
                config.silent_grace_s,
                len(segs) - len(kept),
            )
        for seg in segs:
            if seg.segment_id in kept:
                if seg.confirmed:
                    st.segments.set_aside(seg.segment_id, mono)
            else:
                unmount(seg.segment_id)
    for seg in st.segments.unconfirmed():
        if seg.set_aside and mono - seg.set_aside > config.silent_grace_s:
            log.warning(
                "segment %s of daemon %s set aside %.0f s ago and not mounted again: dropping its replicas",
                seg.segment_id,
                seg.daemon_id,
                mono - seg.set_aside,
            )
            unmount(seg.segment_id)


def drop_unconfirmed(st: MetaState, config: MetaConfig, mono: float, unmount: Callable[[str], int]) -> None:
    """The reconcile window after a takeover closed: segments loaded then that no daemon mounted
    again are as a silent daemon's (drop_silent): DRAM and GPU ones set aside for silent_grace_s
    (their daemon may be cut off from this leader only), SSD ones dropped (their journal announces
    them when mounted again)."""
    for seg in st.segments.unconfirmed():
        if seg.set_aside:
            continue
        keep = seg.info.tier is not Tier.SSD and config.silent_grace_s > 0
        log.warning(
            "segment %s of daemon %s was not mounted again within %.0f s of the takeover: %s",
            seg.segment_id,
            seg.daemon_id,
            config.heartbeat_ttl_s,
            f"set aside for {config.silent_grace_s:.0f} s more" if keep else "dropping its replicas",
        )
        if keep:
            st.segments.set_aside(seg.segment_id, mono)
        else:
            unmount(seg.segment_id)


def evict_to_watermarks(
    st: MetaState, tiering: Tiering, policy: EvictionPolicy, config: MetaConfig, now: float
) -> None:
    tiering.enforce_watermark(Tier.GPU, config.high_watermark, config.low_watermark, now)
    tiering.enforce_watermark(Tier.SSD, config.ssd_high_watermark, config.ssd_low_watermark, now)
    ssd_daemons = st.ssd_daemons()  # their DRAM is demoted by the daemons' claims
    used, capacity = st.usage(Tier.DRAM, exclude=ssd_daemons)
    # Space evicted earlier that waits for its last grant is on its way back: not counted again.
    used -= st.returning({s.number for s in st.segments.segments(Tier.DRAM) if s.daemon_id not in ssd_daemons})[0]
    if capacity and used > capacity * config.high_watermark:
        need = used - int(capacity * config.low_watermark)
        # Keys with no replica on those daemons: those in the other daemons' segments (of any tier,
        # as the walk over every key found them), less those with a replica on both.
        others = SegmentRecency(st.index, {s.number for s in st.segments.segments() if s.daemon_id not in ssd_daemons})
        skip = quotas.sparing_reserves(st, st.droppable(now, ssd_daemons), Tier.DRAM)
        st.evict(policy.victims(others, skip, need), now)
