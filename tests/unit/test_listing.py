"""ListKeys and Describe on a MetaStore (fake clock), and through a real service and client."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import InvalidArgument
from kvstore.meta.store import MetaStore
from kvstore.results import KeyState
from kvstore.types import Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    s = MetaStore(MetaConfig(lease_ttl_s=5), SIGNER, clock)
    s.mount_segment(segment("s1", "d1", Tier.DRAM, 1 << 20))
    s.mount_segment(segment("s2", "d2", Tier.DRAM, 1 << 20))
    yield s
    s.check_invariants()


def put(store, keys, size=100, replicas=1):
    commit(store, keys, store.put_start(keys, [size] * len(keys), replicas).results)


def test_pages_through_a_prefix_in_byte_order(store):
    put(store, [f"a/{i:03}" for i in range(250)] + ["b/1", "a"])
    seen, cursor, pages = [], "", 0
    while True:
        page = store.list_keys("a/", 100, cursor)
        assert len(page.keys) <= 100 and page.sizes == (100,) * len(page.keys)
        seen += page.keys
        pages += 1
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    assert seen == [f"a/{i:03}" for i in range(250)] and pages == 3
    assert store.list_keys().keys == ("a", *seen, "b/1")
    assert store.list_keys("zzz").keys == () and store.list_keys("zzz").next_cursor == ""


def test_pending_keys_are_not_listed_but_are_described(store):
    put(store, ["done"])
    store.put_start(["half"], [100])
    assert store.list_keys().keys == ("done",)
    done, half, gone = store.describe(["done", "half", "gone"])
    assert (done.state, done.size, done.checksum) == (KeyState.COMPLETE, 100, 7)
    assert half.state is KeyState.PENDING and half.size == 100 and len(half.replicas) == 1
    assert gone.state is KeyState.ABSENT and gone.replicas == ()


def test_describe_shows_replicas_tiers_lease_and_pin(store, clock):
    put(store, ["k"], replicas=2)
    (info,) = store.describe(["k"])
    assert {r.daemon_id for r in info.replicas} == {"d1", "d2"} and info.tiers == (Tier.DRAM,)
    assert info.lease_s == 0 and info.pin_s == 0 and not info.moving
    store.get(["k"], client_host=HOST, client_id="c")
    store.pin(["k"], 30)
    clock.advance(1)
    (info,) = store.describe(["k"])
    assert info.lease_s == pytest.approx(4) and info.pin_s == pytest.approx(29)
    clock.advance(10)
    (info,) = store.describe(["k"])
    assert info.lease_s == 0 and info.pin_s == pytest.approx(19)


def test_bad_limits_are_refused(store):
    with pytest.raises(InvalidArgument, match="limit"):
        store.list_keys("", 100_000)
    with pytest.raises(InvalidArgument):
        store.describe([""])
