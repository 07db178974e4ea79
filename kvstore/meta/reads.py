"""The service's side of a get and a remove, one key at a time, under the store's lock.

A Get hands out a read lease (the block stays in place while its reader copies) and a read grant
per replica, LOCAL for replicas the reader reaches over shm, replicas on daemons a client
reported failing last. A daemon-checked read grant stays honourable until it expires, even once
its lease is handed back, so the key's grant horizon moves with it (the space waits for it).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.grant import LOCAL, GrantSigner
from kvstore.meta.index import ObjectState
from kvstore.meta.segments import OFFSET_BITS, unpack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tiering import Tiering
from kvstore.results import OK, GetResult, KeyResult, found
from kvstore.types import Grant, GrantMode, Tier

_OFFSET_MASK = (1 << OFFSET_BITS) - 1


class Reads:
    def __init__(self, config: MetaConfig, state: MetaState, signer: GrantSigner, tiering: Tiering) -> None:
        self.config = config
        self._st = state
        self._signer = signer
        self._tiering = tiering

    def get(self, key: str, until: float, client_host: str, holder: str, now: float) -> GetResult:
        """`until`: the lease's and the grants' expiry, no later than the state's grant ceiling
        (the caller caps it once per slice of keys)."""
        st = self._st
        entry = st.index.get(key)
        if entry is None:
            return self._miss(key)
        st.index.touch(key)
        lease_id = st.leases.hold(key, until, holder)
        until_ms = int(until * 1000)
        loc = entry.locations
        if type(loc) is int:  # one replica, as most blocks have
            seg = st.segment_of(loc)
            if seg.confirmed:
                flags = LOCAL if seg.local_to(client_host) else 0
                offset = loc & _OFFSET_MASK
                grant = self._signer.sign(seg.segment_id, offset, entry.size, GrantMode.READ, until_ms, flags)
                if not flags:
                    st.note_grant(key, until)
                tier = seg.info.tier
                st.tier_counters[tier, "hits"] += 1
                if tier is Tier.DRAM:  # _read_from, for one replica
                    self._tiering.note_dram_read(key)
                elif tier is Tier.SSD:
                    self._tiering.note_ssd_read(key)
                return found(entry.size, entry.checksum, (grant,), lease_id)
            return self._unconfirmed(key, lease_id, holder)
        grants: list[tuple[bool, Grant]] = []
        tiers: list[Tier] = []
        checked = False
        for replica in entry.replicas():
            seg = st.segment_of(replica)
            if not seg.confirmed:  # loaded after a takeover, or set aside: its daemon has not vouched for it since
                continue
            tiers.append(seg.info.tier)
            flags = LOCAL if seg.local_to(client_host) else 0
            checked = checked or not flags
            offset = replica & _OFFSET_MASK
            grant = self._signer.sign(seg.segment_id, offset, entry.size, GrantMode.READ, until_ms, flags)
            grants.append((st.segments.is_suspect(seg.daemon_id, now), grant))
        if not grants:
            return self._unconfirmed(key, lease_id, holder)
        if checked:
            st.note_grant(key, until)
        self._read_from(key, tiers)
        ordered = tuple(g for _, g in sorted(grants, key=lambda sg: sg[0])) if len(grants) > 1 else (grants[0][1],)
        return GetResult(size=entry.size, checksum=entry.checksum, grants=ordered, lease_id=lease_id)

    def _unconfirmed(self, key: str, lease_id: int, holder: str) -> GetResult:
        """No replica of `key` is in a segment its daemon has vouched for: no grant, no lease."""
        self._st.leases.end(lease_id, holder)
        return GetResult(
            ErrorCode.UNAVAILABLE,
            f"{key!r}: no replica's daemon has mounted it again since this service took over or stopped "
            "hearing from it; retry shortly",
        )

    def leased_in(self, holder: str, segment_ids: Sequence[str], now: float) -> list[str]:
        """Those of `segment_ids` that hold a replica of a key `holder` has a read lease on: a
        reader's report of a failed transfer counts only where it was given a grant."""
        if not segment_ids:
            return []
        numbers: set[int] = set()
        for key in self._st.leases.keys_of(holder, now):
            entry = self._st.index.get(key)
            if entry is not None:
                numbers.update(unpack_location(loc)[0] for loc in entry.replicas())
        found = (self._st.segments.get(sid) for sid in segment_ids)
        return [seg.segment_id for seg in found if seg is not None and seg.number in numbers]

    def touched(self, keys: Sequence[str]) -> None:
        """Reads a client made from cached locations (no Get): each key becomes the most recently
        used and counts as a hit of its replicas' tiers, promotion included, as the Get it saved would."""
        st = self._st
        for key in keys:
            entry = st.index.get(key)
            if entry is None:
                continue
            st.index.touch(key)
            segs = (st.segment_of(loc) for loc in entry.replicas())
            self._read_from(key, [seg.info.tier for seg in segs if seg.confirmed])

    def _read_from(self, key: str, tiers: list[Tier]) -> None:
        """A read of `key` from replicas on `tiers`: a hit of each; a block only on SSD (or only in
        DRAM, below a GPU tier) counts toward its promotion."""
        if not tiers:
            return
        for tier in tiers:
            self._st.tier_counters[tier, "hits"] += 1
        if all(t is Tier.SSD for t in tiers):
            self._tiering.note_ssd_read(key)
        elif all(t is Tier.DRAM for t in tiers):
            self._tiering.note_dram_read(key)

    def _miss(self, key: str) -> GetResult:
        if self._st.index.get_pending(key) is not None:
            return GetResult(ErrorCode.KEY_BUSY, f"{key!r} is still being written; retry once its put ends")
        return GetResult(
            ErrorCode.KEY_NOT_FOUND,
            f"{key!r} is not stored (never put, removed, evicted, or lost with its daemon); recompute it",
        )

    def remove(self, key: str, force: bool, now: float) -> KeyResult:
        st = self._st
        state = st.index.state(key)
        if state is ObjectState.ABSENT:
            return KeyResult(ErrorCode.KEY_NOT_FOUND, f"{key!r} is not stored")
        if state is ObjectState.PENDING:
            return KeyResult(
                ErrorCode.KEY_BUSY, f"{key!r} is being written; revoke the put or remove it after the put ends"
            )
        if st.leases.held(key, now) and not force:
            left = st.leases.until(key) - now
            return KeyResult(
                ErrorCode.KEY_BUSY,
                f"{key!r} is being read (lease ends in {left:.1f} s); retry then, or remove with force",
            )
        st.drop(key, now)  # its space waits for its readers and grants
        return OK
