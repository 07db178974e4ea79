"""The metadata service's periodic upkeep, under the store's lock: what time alone changes.

Expired puts are revoked, leases and pins end, quarantined space that came due is freed, stale
moves are abandoned, daemons silent past their TTL lose their segments, segments loaded after a
takeover and never mounted again are dropped, and DRAM (and GPU, SSD) is evicted back under its
watermarks.
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
    """Daemons that have not heartbeated within heartbeat_ttl_s (monotonic) lose their segments
    (unmount: SsdForgets.unmount, so a persistent one's replicas are dropped, not deleted)."""
    for daemon in st.segments.silent_daemons(mono, config.heartbeat_ttl_s):
        log.warning(
            "daemon %s silent for %.1f s: dropping its %d segments",
            daemon.daemon_id,
            mono - daemon.last_heartbeat,
            len(daemon.segment_ids),
        )
        for segment_id in list(daemon.segment_ids):
            unmount(segment_id)


def drop_unconfirmed(st: MetaState, config: MetaConfig, unmount: Callable[[str], int]) -> None:
    """The reconcile window after a takeover closed: segments no daemon mounted again go."""
    for seg in st.segments.unconfirmed():
        log.warning(
            "segment %s of daemon %s was not mounted again within %.0f s of the takeover: dropping its replicas",
            seg.segment_id,
            seg.daemon_id,
            config.heartbeat_ttl_s,
        )
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
