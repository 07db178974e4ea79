"""A read lease binds its holder to the end: once its key is removed (force) and the key's space is
held for its readers, only the reader that took the lease can hand it back and so free the space;
another caller naming the id changes nothing. Lease and region ids are fresh draws from the OS
generator (`secrets`), never a seeded Mersenne Twister whose next outputs follow from observed ones.
MetaStore on a fake clock, check_invariants() after each step."""

from __future__ import annotations

import secrets
import struct

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.meta import lease
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment

SEG = 1 << 20


@pytest.fixture
def clock():
    return FakeClock()


def _store(clock: FakeClock) -> MetaStore:
    store = MetaStore(MetaConfig(heartbeat_ttl_s=1000, high_watermark=1.0, low_watermark=0.9), SIGNER, clock)
    store.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    return store


def _quarantined(store: MetaStore) -> int:
    return store.stats().quarantined_bytes


def test_only_the_reader_that_holds_a_lease_frees_the_space_it_keeps(clock):
    store = _store(clock)
    commit(store, ["k"], store.put_start(["k"], [4096], client_host=HOST).results)
    clock.advance(60)  # the write grant is long over: only the reader keeps the space now
    [got] = store.get(["k"], client_host=HOST, client_id="reader").results  # LOCAL grants: no daemon checks
    assert got.lease_id
    assert store.remove(["k"], force=True)[0].code == 0
    assert _quarantined(store) == 4096  # the reader may still be copying
    store.check_invariants()

    store.get([], released=[got.lease_id], client_id="intruder")
    store.remove(["other"], released=[got.lease_id], client_id="intruder")
    store.get([], released=[got.lease_id], client_id="")
    assert _quarantined(store) == 4096, "another caller's release freed space a reader still holds"
    store.check_invariants()

    store.get([], released=[got.lease_id], client_id="reader")
    assert _quarantined(store) == 0
    store.check_invariants()


def test_lease_and_region_ids_are_fresh_draws_from_the_os_generator(clock, monkeypatch):
    drawn: list[int] = []

    def randbits(k: int) -> int:
        drawn.append((0x5EC0 << 40 | len(drawn) + 1) & ((1 << k) - 1))
        return drawn[-1]

    def urandom(n: int) -> bytes:  # read lease ids: drawn 512 at a time (kvstore/meta/lease.py)
        words = [(0x5EC0 << 40 | len(drawn) + i + 1) << 1 for i in range(n // 8)]
        drawn.extend(w >> 1 for w in words)
        return struct.pack(f"<{n // 8}Q", *words)

    monkeypatch.setattr(secrets, "randbits", randbits)
    monkeypatch.setattr(lease, "urandom", urandom)
    store = _store(clock)
    commit(store, ["a", "b"], store.put_start(["a", "b"], [64, 64], client_host=HOST).results)
    drawn.clear()
    leases = [r.lease_id for r in store.get(["a", "b"], client_host=HOST, client_id="r").results]
    assert leases == drawn[::-1][:2]
    drawn.clear()
    region = store.regions.reserve("w1", HOST, 4096)
    assert [region.region_id] == drawn
    store.check_invariants()
