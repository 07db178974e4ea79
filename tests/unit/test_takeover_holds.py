"""A service that takes over writes at once: only the space its predecessor's grants can still
reach waits (docs/ha.md, kvstore/meta/holds.py). The predecessor journals what it holds outside
its objects (a put in progress, a region, space quarantined behind a reader) through a real
GroupCommit into tables kept here as Redis would keep them; the successor restores from them."""

from __future__ import annotations

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.holds import decode_hold
from kvstore.meta.journal import Changes, GroupCommit
from kvstore.meta.records import ObjectRecord, SegmentRecord, decode_object, decode_pin, decode_segment
from kvstore.meta.segments import pack_location
from kvstore.meta.store import MetaStore
from kvstore.types import MoveKind, Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment

BLOCK = 64 << 10
SEG = 8 * BLOCK
CONFIG = MetaConfig(lease_ttl_s=5, write_grant_ttl_s=10, heartbeat_ttl_s=1000, high_watermark=1.0, low_watermark=0.9)
TABLES = ("objects", "segments", "pins", "tenants", "holds")


class Records:
    """The journal's tables as Redis keeps them: the last write of each record wins."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, bytes]] = {t: {} for t in TABLES}

    def journal(self) -> GroupCommit:
        return GroupCommit(self._write, "memory")

    def _write(self, changes: Changes) -> None:
        for name in TABLES:
            table = self.tables[name]
            for field, value in getattr(changes, name).items():
                if value is None:
                    table.pop(field, None)
                else:
                    table[field] = value

    def successor(self, clock: FakeClock) -> MetaStore:
        """A service that takes over these records (not the first leader), its segment mounted again."""
        store = MetaStore(CONFIG, SIGNER, clock, journal=self.journal())
        t = self.tables
        store.restore(
            [decode_segment(v) for v in t["segments"].values()],
            [(k, decode_object(v)) for k, v in t["objects"].items()],
            [(k, decode_pin(v)) for k, v in t["pins"].items()],
            dict(t["tenants"]),
            holds=[decode_hold(k.encode(), v) for k, v in t["holds"].items()],
        )
        store.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
        return store


def offsets(store: MetaStore, keys: list[str]) -> list[int]:
    """PutStart each key (one block); the offset of each one placed."""
    reply = store.put_start(keys, [BLOCK] * len(keys))
    assert all(r.code == ErrorCode.OK for r in reply.results), [r.message for r in reply.results]
    return [r.grants[0].offset for r in reply.results]


def test_the_successor_writes_at_once_but_not_where_old_grants_reach():
    clock, records = FakeClock(), Records()
    old = MetaStore(CONFIG, SIGNER, clock, journal=records.journal())
    old.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    started = old.put_start(["kept", "read", "pending"], [BLOCK] * 3)
    commit(old, ["kept", "read"], started.results[:2])
    pending_at, read_at = started.results[2].grants[0].offset, started.results[1].grants[0].offset
    old.get(["read"], client_id="reader")
    assert old.remove(["read"], force=True)[0].code == ErrorCode.OK  # the reader still copies it
    assert len(records.tables["holds"]) == 2  # "pending" and "read" are held, durably

    new = records.successor(clock)  # the old leader died; its grants live on for a while
    assert new.stats().writes_open
    placed = offsets(new, [f"n{i}" for i in range(5)])  # every free block, at once
    assert pending_at not in placed and read_at not in placed
    refused = new.put_start(["late"], [BLOCK]).results[0]
    assert refused.code == ErrorCode.NO_SPACE and refused.retry_after_ms > 0  # the held space comes back
    assert new.get(["kept"]).results[0].code == ErrorCode.OK

    clock.advance(CONFIG.write_grant_ttl_s + 2 + 1)  # every grant of the old leader has expired
    new.tick()
    assert sorted(offsets(new, ["late", "later"])) == sorted([pending_at, read_at])
    new.check_invariants()


def test_space_the_successor_frees_waits_for_the_predecessors_read_grants():
    clock, records = FakeClock(), Records()
    old = MetaStore(CONFIG, SIGNER, clock, journal=records.journal())
    old.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    started = old.put_start([f"k{i}" for i in range(8)], [BLOCK] * 8)  # the whole segment
    commit(old, [f"k{i}" for i in range(8)], started.results)
    old.get(["k0"], client_id="reader")  # a grant over k0 the successor never hears of

    new = records.successor(clock)
    assert new.remove(["k0"])[0].code == ErrorCode.OK  # no lease of its own on k0
    refused = new.put_start(["n"], [BLOCK]).results[0]
    assert refused.code == ErrorCode.NO_SPACE and refused.retry_after_ms > 0
    clock.advance(CONFIG.write_grant_ttl_s + 2 + 1)
    new.tick()
    assert offsets(new, ["n"]) == [started.results[0].grants[0].offset]


def test_a_region_is_held_whole_and_its_values_stay_theirs():
    clock, records = FakeClock(), Records()
    old = MetaStore(CONFIG, SIGNER, clock, journal=records.journal())
    old.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    region = old.regions.reserve("w1", HOST, 4 * BLOCK)
    assert region.code == ErrorCode.OK and region.grant is not None
    start = region.grant.offset
    assert old.regions.put_commit("w1", region.region_id, ["v"], [start], [BLOCK], [9])[0].code == ErrorCode.OK

    new = records.successor(clock)
    assert new.get(["v"]).results[0].code == ErrorCode.OK
    placed = offsets(new, [f"n{i}" for i in range(4)])  # the four blocks outside the region
    assert all(not start <= off < start + 4 * BLOCK for off in placed)
    assert new.put_start(["n4"], [BLOCK]).results[0].code == ErrorCode.NO_SPACE
    clock.advance(CONFIG.write_grant_ttl_s + 2 + 1)
    new.tick()
    assert sorted(offsets(new, ["n4", "n5", "n6"])) == [start + BLOCK * i for i in (1, 2, 3)]
    new.check_invariants()


def test_holds_end_with_what_they_held():
    clock, records = FakeClock(), Records()
    store = MetaStore(CONFIG, SIGNER, clock, journal=records.journal())
    store.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    started = store.put_start(["a", "b"], [BLOCK] * 2)
    assert sorted(records.tables["holds"]) == sorted(
        format(pack_location(1, r.grants[0].offset), "x") for r in started.results
    )
    commit(store, ["a"], started.results[:1])  # owned by "a" now
    assert store.put_revoke(["b"])[0].code == ErrorCode.OK  # held until its write grant expires
    assert list(records.tables["holds"]) == [format(pack_location(1, started.results[1].grants[0].offset), "x")]
    store.remove(["a"])
    clock.advance(CONFIG.write_grant_ttl_s + 2 + 1)
    store.tick()
    assert records.tables["holds"] == {}


def test_no_moves_for_a_daemon_until_every_tier_of_it_is_mounted_again():
    """Right after a takeover a daemon's DRAM may be confirmed before its SSD: demoting then would
    find no SSD to place on and make room by evicting (both tiers' blocks)."""
    clock = FakeClock()
    config = MetaConfig(lease_ttl_s=5, write_grant_ttl_s=10, heartbeat_ttl_s=1000, high_watermark=0.5,
                        low_watermark=0.4)  # fmt: skip
    store = MetaStore(config, SIGNER, clock, journal=Records().journal())
    dram, ssd = segment("dram", "d1", Tier.DRAM, SEG), segment("ssd", "d1", Tier.SSD, SEG)
    on_dram = [(f"d{i}", ObjectRecord(BLOCK, 5, 1, (pack_location(1, i * BLOCK),))) for i in range(6)]
    on_ssd = [(f"s{i}", ObjectRecord(BLOCK, 5, 1, (pack_location(2, i * BLOCK),))) for i in range(8)]
    store.restore([SegmentRecord(1, dram), SegmentRecord(2, ssd)], on_dram + on_ssd, [])
    clock.advance(config.write_grant_ttl_s + 2 + 1)  # even once no old grant is left
    store.mount_segment(dram)  # DRAM is back (6 of 8 blocks used: over its watermark), SSD not yet
    assert store.claim_moves("d1", 1 << 30) == []
    keys = [k for k, _ in on_dram + on_ssd]
    assert store.exists(keys) == [True] * len(keys)
    store.mount_segment(ssd)
    assert MoveKind.DEMOTE in {t.kind for t in store.claim_moves("d1", 1 << 30)}


def test_a_put_before_the_daemons_mount_again_is_told_to_retry():
    """Between a takeover and the daemons' next heartbeat no segment is usable: that is no reason
    to tell a writer to add memory; it is told to ask again shortly (and the SDK waits)."""
    clock = FakeClock()
    store = MetaStore(CONFIG, SIGNER, clock, journal=Records().journal())
    info = segment("s1", "d1", Tier.DRAM, SEG)
    store.restore([SegmentRecord(1, info)], [], [])
    refused = store.put_start(["k"], [BLOCK]).results[0]
    assert refused.code == ErrorCode.NO_SPACE and refused.retry_after_ms > 0
    store.mount_segment(info)
    assert store.put_start(["k"], [BLOCK]).results[0].code == ErrorCode.OK


def test_a_dram_segment_not_mounted_again_at_a_takeover_is_set_aside_not_dropped():
    """A daemon cut off from the new leader for its whole reconcile window keeps its DRAM blocks:
    when it mounts the segment again they are all readable (DROPPED, docs/fleet.md)."""
    clock, records = FakeClock(), Records()
    old = MetaStore(CONFIG, SIGNER, clock, journal=records.journal())
    old.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    keys = [f"k{i}" for i in range(4)]
    commit(old, keys, old.put_start(keys, [BLOCK] * 4).results)
    config = MetaConfig(heartbeat_ttl_s=10, silent_grace_s=30, tick_interval_s=1)
    new = MetaStore(config, SIGNER, clock, journal=records.journal())
    t = records.tables
    new.restore([decode_segment(v) for v in t["segments"].values()],
                [(k, decode_object(v)) for k, v in t["objects"].items()], [], {})  # fmt: skip
    for _ in range(25):  # the 10 s window closes, 15 s more: set aside, not dropped
        clock.advance(1)
        new.tick()
    assert new.reconciling == 0 and new.stats().daemons == ()
    assert new.exists(keys) == [True] * 4
    assert {r.code for r in new.get(keys).results} == {ErrorCode.UNAVAILABLE}
    assert new.heartbeat("d1", ["s1"]) == ["s1"]
    new.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    assert all(r.code is ErrorCode.OK for r in new.get(keys).results)
    new.check_invariants()
