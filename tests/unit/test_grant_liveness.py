"""Space is handed to a new key only when no grant for the old allocation can still be honoured,
and no reader is still copying; a writer's failed replicas, a lost daemon and a client's report
of a failed transfer are handled without failing the put. Fake clock, invariants after each step."""

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.grant import LOCAL
from kvstore.meta.state import GRACE_S
from kvstore.meta.store import MetaStore
from kvstore.results import MoveOutcome, PutWritten
from kvstore.types import MAX_BATCH_KEYS, GrantMode, MoveKind, Tier
from tests.meta_helpers import HOST, SIGNER, commit, receipts, segment

SEG = 4096
LEASE, WRITE = 5.0, 8.0


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    cfg = MetaConfig(
        lease_ttl_s=LEASE, put_lease_ttl_s=20, write_grant_ttl_s=WRITE, heartbeat_ttl_s=1000, suspect_ttl_s=10
    )
    s = MetaStore(cfg, SIGNER, clock)
    s.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    yield s
    s.check_invariants()


def free(store) -> bool:
    """Whether the one segment's space is available for a new key now (and gives it back)."""
    [r] = store.put_start(["probe"], [SEG]).results
    if r.code:
        return False
    store.put_revoke(["probe"])  # LOCAL? no: a tcp grant; the space now waits for it again
    return True


def stored(store, key="a", **start):
    [r] = store.put_start([key], [SEG], **start).results
    assert r.code is ErrorCode.OK
    return r


def test_a_tcp_read_grant_keeps_the_space_after_its_lease_is_handed_back(store, clock):
    commit(store, ["a"], [stored(store)])
    got = store.get(["a"], client_id="c1").results[0]
    assert not got.grants[0].flags & LOCAL
    store.get([], released=[got.lease_id], client_id="c1")
    store.remove(["a"], client_id="c1")
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.NO_SPACE  # the grant still reads
    assert store.stats().quarantined_bytes == SEG
    clock.advance(LEASE + GRACE_S + 0.1)
    store.tick()
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.OK


def test_a_shm_read_hands_the_space_back_with_its_lease(store, clock):
    commit(store, ["a"], [stored(store)])
    got = store.get(["a"], client_host=HOST, client_id="c1").results[0]
    assert got.grants[0].flags & LOCAL  # no daemon honours it
    store.remove(["a"], released=[got.lease_id], client_id="c1")
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.OK


def test_a_lease_ends_only_by_its_holder(store, clock):
    commit(store, ["a"], [stored(store)])
    lease = store.get(["a"], client_host=HOST, client_id="c1").results[0].lease_id
    store.get([], released=[lease], client_id="someone-else")
    assert store.remove(["a"])[0].code is ErrorCode.KEY_BUSY
    store.get([], released=[lease], client_id="c1")
    assert store.remove(["a"])[0].code is ErrorCode.OK


def test_a_receipt_commits_and_spends_the_write_grant(store, clock):
    r = stored(store)
    assert store.put_end(["a"], [1], [receipts(r)]).results[0].code is ErrorCode.OK
    store.remove(["a"])
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.OK  # nothing can write there again


@pytest.mark.parametrize("proof", ["none", "forged", "another grant's"])
def test_a_daemon_checked_replica_without_its_receipt_is_not_committed(store, clock, proof):
    """Nothing proves a byte was written: the range may still hold its last owner's bytes."""
    r = stored(store)
    other = SIGNER.sign("s1", r.grants[0].offset, 16, GrantMode.WRITE, r.grants[0].expires_ms)  # a shorter range
    written = {
        "none": PutWritten(0, (b"",)),
        "forged": PutWritten(0, (bytes(16),)),
        "another grant's": PutWritten(0, (SIGNER.receipt(other),)),
    }[proof]
    [result] = store.put_end(["a"], [1], [written]).results
    assert result.code is ErrorCode.KEY_NOT_FOUND and "receipt" in result.message
    assert store.exists(["a"]) == [False]
    assert store.get(["a"]).results[0].code is ErrorCode.KEY_NOT_FOUND
    # The unspent grant may still write there until it expires: the space waits for it.
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.NO_SPACE
    clock.advance(WRITE + GRACE_S + 0.1)
    store.tick()
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.OK


@pytest.mark.parametrize("proof", ["none", "forged"])
def test_a_writer_trusted_with_unchecked_transports_commits_without_a_receipt_and_its_grant_stays_live(
    store, clock, proof
):
    stored(store)
    written = {"none": PutWritten(0, (b"",)), "forged": PutWritten(0, (bytes(16),))}[proof]
    assert store.put_end(["a"], [1], [written], unchecked_ok=True).results[0].code is ErrorCode.OK
    store.remove(["a"])
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.NO_SPACE
    clock.advance(WRITE + GRACE_S + 0.1)
    store.tick()
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.OK


def test_a_revoked_put_keeps_its_space_until_its_grants_expire_unless_they_were_local(store, clock):
    stored(store)
    store.put_revoke(["a"])
    assert store.put_start(["b"], [SEG]).results[0].code is ErrorCode.NO_SPACE
    clock.advance(WRITE + GRACE_S + 0.1)
    store.tick()
    stored(store, "c", client_host=HOST)  # a shm writer: LOCAL grants
    store.put_revoke(["c"])
    assert store.put_start(["d"], [SEG]).results[0].code is ErrorCode.OK


def test_batches_over_the_limit_are_refused(store):
    with pytest.raises(InvalidArgument, match="limit"):
        store.exists([f"k{i}" for i in range(MAX_BATCH_KEYS + 1)])
    assert len(store.exists([f"k{i}" for i in range(MAX_BATCH_KEYS)])) == MAX_BATCH_KEYS


@pytest.fixture
def three(clock):
    cfg = MetaConfig(lease_ttl_s=LEASE, put_lease_ttl_s=20, write_grant_ttl_s=WRITE, heartbeat_ttl_s=10)
    s = MetaStore(cfg, SIGNER, clock)
    for d in ("d1", "d2", "d3"):
        s.mount_segment(segment(f"{d}-dram", d, Tier.DRAM, 64 * SEG))
    yield s
    s.check_invariants()


def daemons_of(store, key):
    """The daemons holding `key` (read as a shm client that hands its lease straight back)."""
    got = store.get([key], client_host=HOST, client_id="probe").results[0]
    store.get([], released=[got.lease_id], client_id="probe")
    return sorted(g.segment_id.split("-")[0] for g in got.grants)


def test_a_failed_replica_commits_the_others_and_is_copied_again(three, clock):
    [r] = three.put_start(["a"], [SEG], 2).results
    failed, ok = 0, 1
    reply = three.put_end(
        ["a"],
        [9],
        [PutWritten(1 << failed, tuple(SIGNER.receipt(g) if i == ok else b"" for i, g in enumerate(r.grants)))],
        [r.grants[failed].segment_id],
    )
    assert reply.results[0].code is ErrorCode.OK and reply.replicas == (1,)
    assert three.stats().under_replicated == 1
    bad = r.grants[failed].segment_id.split("-")[0]
    placed = three.put_start(["x", "y", "z"], [SEG] * 3).results  # the reported daemon gets nothing
    assert bad not in {g.segment_id.split("-")[0] for p in placed for g in p.grants}
    commit(three, ["x", "y", "z"], placed)
    target = next(d for d in ("d1", "d2", "d3") if d not in daemons_of(three, "a") and d != bad)
    tasks = three.claim_moves(target, 1 << 30)
    [copy] = [t for t in tasks if t.kind is MoveKind.REPLICATE]
    assert copy.key == "a" and copy.source.mode.name == "READ" and copy.source_segment is not None
    three.check_invariants()
    three.complete_moves(target, [MoveOutcome(copy.move_id, True)])
    assert len(daemons_of(three, "a")) == 2 and three.stats().under_replicated == 0


def test_a_daemon_silent_past_its_grace_leaves_its_keys_under_replicated_and_they_are_copied(three, clock):
    placed = three.put_start(["a", "b"], [SEG, SEG], 2).results
    commit(three, ["a", "b"], placed)
    lost = daemons_of(three, "a")[0]
    for _ in range(10):  # `lost` silent for 80 s: set aside after its 10 s TTL, dropped 60 s later
        for d in ("d1", "d2", "d3"):
            if d != lost:
                three.heartbeat(d, [f"{d}-dram"])
        clock.advance(8)
        three.tick()
    assert three.exists(["a", "b"]) == [True, True]
    short = three.stats().under_replicated
    assert short >= 1
    copied = 0
    for d in ("d1", "d2", "d3"):
        if d == lost:
            continue
        tasks = [t for t in three.claim_moves(d, 1 << 30) if t.kind is MoveKind.REPLICATE]
        three.complete_moves(d, [MoveOutcome(t.move_id, True) for t in tasks])
        copied += len(tasks)
    assert copied == short and three.stats().under_replicated == 0
    assert all(len(daemons_of(three, k)) == 2 for k in ("a", "b"))


def test_a_failed_copy_frees_its_destination_and_is_tried_again(three, clock):
    [r] = three.put_start(["a"], [SEG], 2).results
    three.put_end(["a"], [9], [PutWritten(0b10, (SIGNER.receipt(r.grants[0]), b""))])
    have = daemons_of(three, "a")
    target = next(d for d in ("d1", "d2", "d3") if d not in have)
    [copy] = [t for t in three.claim_moves(target, 1 << 30) if t.kind is MoveKind.REPLICATE]
    three.complete_moves(target, [MoveOutcome(copy.move_id, False, "read failed")])
    three.check_invariants()
    assert three.stats().under_replicated == 1
    assert [t.key for t in three.claim_moves(target, 1 << 30) if t.kind is MoveKind.REPLICATE] == ["a"]
