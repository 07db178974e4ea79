"""The quarantine's books (space freed while a grant or a reader may still touch it): what a put
asks of it on its way costs the same however much is held, and its per-segment bytes and due
times agree with the held spaces through every kind of change."""

import random
import sys
from functools import partial

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.meta.lease import Reader
from kvstore.meta.quarantine import Quarantine
from kvstore.meta.segments import pack_location, unpack_location
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.meta_helpers import SIGNER, commit, segment

BLOCK = 4096


def calls_made(work) -> int:
    """Python-level calls (functions, generators, lambdas) `work()` makes."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event == "call"

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def put_cost_with_held(held: int) -> int:
    """Calls one put makes with `held` removed blocks' space held for their tcp reads' grants."""
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("dram", "d1", Tier.DRAM, 1 << 30))
    keys = [f"k{i}" for i in range(held)]
    commit(store, keys, store.put_start(keys, [BLOCK] * held).results)
    store.get(keys, client_host="elsewhere", client_id="reader")  # daemon-checked grants: not LOCAL
    store.remove(keys, force=True)
    assert store.stats().quarantined_bytes == held * BLOCK

    def one_put() -> None:
        commit(store, ["new"], store.put_start(["new"], [BLOCK]).results)

    cost = calls_made(one_put)
    store.check_invariants()
    return cost


def test_a_put_costs_the_same_however_much_space_is_held():
    assert put_cost_with_held(2000) == put_cost_with_held(20)


def test_the_books_agree_with_the_held_spaces_through_every_change():
    rng = random.Random(7)
    q = Quarantine(grace=1.0)
    leases = iter(range(1, 1_000_000))
    readers: list[tuple[int, str]] = []
    now = 0.0
    for _ in range(3000):
        op = rng.random()
        if op < 0.5:
            locs = tuple(pack_location(n, rng.randrange(1 << 20)) for n in rng.sample(range(6), rng.randint(1, 3)))
            n_readers = rng.randint(0, 2)
            lease = {next(leases): Reader(now + rng.uniform(0, 5), f"c{rng.randrange(3)}") for _ in range(n_readers)}
            q.hold(locs, rng.choice((BLOCK, 2 * BLOCK)), lease, now + rng.uniform(-2, 5))
            readers += [(i, r.holder) for i, r in lease.items()]
        elif op < 0.75 and readers:
            lease_id, holder = readers.pop(rng.randrange(len(readers)))
            q.reader_done(lease_id, holder if rng.random() < 0.9 else "someone else", now)
        elif op < 0.95:
            now += rng.uniform(0, 1)
            q.take_due(now)
        else:
            gone = rng.randrange(6)
            q.forget_segment(partial(_in_segment, gone))
        q.check_invariants()
        assert q.bytes == sum(h.size * len(h.locations) for h in q)


def _in_segment(number: int, location: int) -> bool:
    return unpack_location(location)[0] == number
