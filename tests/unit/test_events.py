"""KV events inside the metadata service: which block a key names, how replicas and parts become
one announcement per tier, the buffer's bound, and the wire format as vLLM's own classes read it."""

from __future__ import annotations

import msgpack
import pytest

from kvstore import blockhash
from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.engines.keys import KeyScheme
from kvstore.events import wire
from kvstore.events.block_ids import block_ref
from kvstore.events.buffer import EventBuffer
from kvstore.events.feed import BlockFeed
from kvstore.events.holdings import SHIFT, Holdings
from kvstore.meta.store import MetaStore
from kvstore.results import MoveOutcome
from kvstore.server.events import attach
from kvstore.types import Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment

SCHEME = KeyScheme(model="org/model", layout="f16-l", block_size=4, tenant="t")
HASHES = SCHEME.block_hashes(list(range(16)))
KEYS = [SCHEME.key(h) for h in HASHES]


class Recorder:
    """A FeedListener that keeps what it is told."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str, Tier | None]] = []

    def changed(self, transitions):
        self.log += [("stored" if t.stored else "removed", t.ref.block, t.tier) for t in transitions]

    def cleared(self):
        self.log.append(("cleared", "", None))


@pytest.fixture
def wired():
    """A store with DRAM and SSD on one daemon, its changes fed (by hand: no thread) to a Recorder."""
    cfg = MetaConfig(high_watermark=0.75, low_watermark=0.5)
    store = MetaStore(cfg, SIGNER, FakeClock())
    store.mount_segment(segment("dram", "d1", Tier.DRAM, 64 << 10))
    store.mount_segment(segment("ssd", "d1", Tier.SSD, 256 << 10))
    buffer, recorder = EventBuffer(), Recorder()
    feed = BlockFeed(buffer, [recorder])
    attach(store, buffer)
    yield store, feed, recorder
    buffer.close()
    store.check_invariants()


def put(store, keys, size=4096, replicas=1):
    commit(store, keys, store.put_start(keys, [size] * len(keys), replicas).results)


def test_a_key_names_its_block_and_the_hash_events_carry():
    ref = block_ref(KEYS[1])
    assert ref == (KEYS[1], "t/org%2Fmodel/f16-l", blockhash.short(HASHES[1]))
    assert block_ref(KEYS[1] + "/7") == ref  # every part of a per-layer block is that block
    assert block_ref(KEYS[1] + "/-1") == ref
    assert block_ref("12345") == ("12345", None, 12345)  # Mooncake master's u64 keys
    assert block_ref("0xff") == ("0xff", None, 255)
    other = block_ref("sglang/page/abc")
    assert other.namespace is None and 0 <= other.hash < 1 << 64
    assert other == block_ref("sglang/page/abc")  # stable
    assert block_ref(str(1 << 64)).hash != 1 << 64  # too big for a u64: hashed like any other key
    assert block_ref(KEYS[1] + "/x").namespace is None  # not a part suffix: not an engine block


def test_copies_are_counted_so_a_tier_is_left_only_by_the_last():
    h = Holdings()
    dram, ssd = SHIFT[Tier.DRAM], SHIFT[Tier.SSD]
    assert h.add("b", dram) and not h.add("b", dram)  # two replicas, one announcement
    assert h.add("b", ssd)
    assert not h.remove("b", dram) and h.tiers("b") == [Tier.DRAM, Tier.SSD]
    assert h.remove("b", dram) and h.remove("b", ssd) and len(h) == 0
    assert not h.remove("never", dram)  # unknown blocks are ignored


def test_puts_demotions_removals_and_a_lost_segment_become_transitions(wired):
    store, feed, rec = wired
    put(store, KEYS[:2])
    feed.flush()
    assert rec.log == [("stored", KEYS[0], Tier.DRAM), ("stored", KEYS[1], Tier.DRAM)]
    rec.log.clear()

    fillers = [f"filler-{i}" for i in range(12)]  # past the high watermark: the oldest are demoted
    put(store, fillers)
    tasks = store.claim_moves("d1", 1 << 30)
    store.complete_moves("d1", [MoveOutcome(t.move_id, True, "") for t in tasks])
    feed.flush()
    demoted = [t.key for t in tasks]
    assert demoted[:2] == KEYS[:2]
    moves = [entry for entry in rec.log if entry[1] in KEYS]
    assert sorted(moves) == sorted(e for k in KEYS[:2] for e in (("stored", k, Tier.SSD), ("removed", k, Tier.DRAM)))
    rec.log.clear()

    store.remove([KEYS[0]])
    store.unmount_segment("ssd")  # the daemon lost its SSD: KEYS[1] goes with it
    feed.flush()
    assert ("removed", KEYS[0], Tier.SSD) in rec.log and ("removed", KEYS[1], Tier.SSD) in rec.log


def test_values_committed_into_a_region_are_announced(wired):
    """A region's commit tells the sink once for its batch; each key is announced all the same."""
    store, feed, rec = wired
    r = store.regions.reserve("w1", HOST, 16 << 10)
    base = r.grant.offset
    results = store.regions.put_commit("w1", r.region_id, [*KEYS[:2], KEYS[0]], [base, base + 4096, base + 8192],
                                       [4096] * 3, [1, 2, 3])  # fmt: skip
    assert [x.code.name for x in results] == ["OK", "OK", "ALREADY_EXISTS"]
    feed.flush()
    assert rec.log == [("stored", KEYS[0], Tier.DRAM), ("stored", KEYS[1], Tier.DRAM)]


def test_per_layer_parts_announce_their_block_once(wired):
    store, feed, rec = wired
    parts = SCHEME.object_keys(HASHES[:1], [0, 1, 2])
    put(store, parts, size=1024)
    feed.flush()
    assert rec.log == [("stored", KEYS[0], Tier.DRAM)]
    store.remove(parts[:2])
    feed.flush()
    assert len(rec.log) == 1  # one part is still held
    store.remove(parts[2:])
    feed.flush()
    assert rec.log[-1] == ("removed", KEYS[0], Tier.DRAM)


def test_a_second_replica_in_the_same_tier_is_not_a_second_block():
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("a", "d1", Tier.DRAM, 1 << 20))
    store.mount_segment(segment("b", "d2", Tier.DRAM, 1 << 20))
    buffer, rec = EventBuffer(), Recorder()
    feed = BlockFeed(buffer, [rec])
    attach(store, buffer)
    put(store, KEYS[:1], replicas=2)
    store.unmount_segment("b")  # one replica lost: the block is still in DRAM
    feed.flush()
    assert rec.log == [("stored", KEYS[0], Tier.DRAM)]
    store.remove(KEYS[:1])
    feed.flush()
    assert rec.log[-1] == ("removed", KEYS[0], Tier.DRAM)
    buffer.close()


def test_a_sink_attached_late_is_told_what_the_store_holds(wired):
    store, _feed, _rec = wired
    put(store, KEYS[:3])
    late, rec2 = EventBuffer(), Recorder()
    attach(store, late)
    BlockFeed(late, [rec2]).flush()
    assert [b for _, b, _ in rec2.log] == KEYS[:3]
    late.close()


def test_a_feed_that_falls_too_far_behind_tells_listeners_to_forget():
    buffer, rec = EventBuffer(limit=3), Recorder()
    feed = BlockFeed(buffer, [rec])
    for key in KEYS:
        buffer.stored((key,), Tier.DRAM)
    buffer.removed((KEYS[0],), Tier.DRAM)  # dropped too: the stream has a hole from here
    feed.flush()
    assert rec.log == [("stored", k, Tier.DRAM) for k in KEYS[:3]] + [("cleared", "", None)]
    assert feed.dropped == len(KEYS) - 3 + 1
    buffer.removed((KEYS[1],), Tier.DRAM)  # after the reset, removals of blocks it forgot are ignored
    buffer.stored((KEYS[3],), Tier.DRAM)
    feed.flush()
    assert rec.log[-1] == ("stored", KEYS[3], Tier.DRAM) and len(rec.log) == 5
    buffer.close()


# -- the wire format -------------------------------------------------------------------------------


def test_vllms_own_classes_decode_what_kvstore_sends():
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    import msgspec

    packer = wire.EventPacker(block_size=32)
    payload = wire.encode_batch(
        12.5,
        [
            packer.stored(7, wire.MEDIUM[Tier.SSD], "t/m/l/" + "ab" * 16),
            packer.removed(8, wire.MEDIUM[Tier.DRAM], "plain"),
            packer.cleared,
        ],
    )
    batch = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch).decode(payload)
    stored, removed, cleared = batch.events
    assert batch.ts == 12.5 and batch.data_parallel_rank == 0
    assert isinstance(stored, kv_events.BlockStored) and stored.block_hashes == [7]
    assert stored.parent_block_hash is None and stored.block_size == 32 and stored.token_ids == []
    assert stored.medium == kv_events.MEDIUM_STORAGE
    assert isinstance(removed, kv_events.BlockRemoved) and removed.medium == kv_events.MEDIUM_CPU
    assert isinstance(cleared, kv_events.AllBlocksCleared)
    assert wire.MEDIUM[Tier.GPU] == kv_events.MEDIUM_GPU


def test_the_packed_events_are_exactly_msgpack_maps():
    packer = wire.EventPacker(block_size=128)
    long_key = "k" * 300  # the str16 length form
    events = [packer.stored((1 << 64) - 1, "CPU", "é/x"), packer.removed(0, "STORAGE", long_key), packer.cleared]
    for n in (1, 15, 16, 70_000):  # every array length form
        ts, decoded, rank = msgpack.unpackb(wire.encode_batch(1.25, events * n))
        assert (ts, rank, len(decoded)) == (1.25, 0, 3 * n)
    ts, decoded, rank = msgpack.unpackb(wire.encode_batch(1.25, events))
    assert decoded == [
        {
            "type": "BlockStored",
            "parent_block_hash": None,
            "token_ids": [],
            "block_size": 128,
            "lora_id": None,
            "lora_name": None,
            "medium": "CPU",
            "block_hashes": [(1 << 64) - 1],
            "object_key": "é/x",
        },
        {"type": "BlockRemoved", "medium": "STORAGE", "block_hashes": [0], "object_key": long_key},
        {"type": "AllBlocksCleared"},
    ]
    assert wire.decode_batch(wire.encode_batch(2.0, events)).events[0] == wire.Stored(
        [(1 << 64) - 1], None, [], 128, "CPU", None, "é/x"
    )


def test_kvstore_decodes_what_vllm_sends():
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    import msgspec

    sent = kv_events.KVEventBatch(
        ts=3.0,
        events=[
            kv_events.BlockStored(
                block_hashes=[1, b"\x00" * 24 + b"\x00\x00\x00\x00\x00\x00\x01\x02"],
                parent_block_hash=9,
                token_ids=[5, 6, 7, 8],
                block_size=2,
                lora_id=None,
                medium="GPU",
                lora_name="sql",
            ),
            kv_events.BlockRemoved(block_hashes=[1], medium="GPU"),
            kv_events.AllBlocksCleared(),
        ],
        data_parallel_rank=3,
    )
    batch = wire.decode_batch(msgspec.msgpack.Encoder().encode(sent))
    assert batch.dp_rank == 3 and batch.ts == 3.0
    assert batch.events[0] == wire.Stored([1, 0x102], 9, [5, 6, 7, 8], 2, "GPU", "sql")  # hash bytes -> vLLM's int
    assert batch.events[1] == wire.Removed([1], "GPU")
    assert batch.events[2] == wire.Cleared()


def test_older_array_events_and_garbage():
    old = msgpack.packb([1.0, [["BlockStored", [4], None, [1, 2], 2, None, "GPU"], ["Unknown", 1]]])
    assert wire.decode_batch(old).events == [wire.Stored([4], None, [1, 2], 2, "GPU")]
    for bad in (b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, [{"type": "BlockStored"}]])):
        with pytest.raises(wire.Undecodable):
            wire.decode_batch(bad)


def test_a_takeover_opens_a_new_epoch_with_what_the_new_store_holds():
    """ServiceEvents follows the store that answers: on Redis a takeover builds another store."""
    import itertools

    import zmq

    from kvstore.server.events import ServiceEvents
    from tests.cluster import wait_until

    clock = FakeClock(start=1_000.0)
    events = ServiceEvents(MetaConfig(events_port=0, host="127.0.0.1"), None, clock)
    assert events.publisher is not None
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    received: list[tuple[int, wire.Batch]] = []

    def receive() -> list[tuple[int, wire.Batch]]:
        while sub.poll(10):
            _, seq, payload = sub.recv_multipart()
            received.append((wire.seq_of(seq), wire.decode_batch(payload)))
        return received

    def stored(batches) -> set[str | None]:
        return {e.object_key for _, b in batches for e in b.events if isinstance(e, wire.Stored)}

    old, new = (MetaStore(MetaConfig(), SIGNER, clock) for _ in range(2))
    for store, daemon in ((old, "d1"), (new, "d2")):
        store.mount_segment(segment(f"dram-{daemon}", daemon, Tier.DRAM, 1 << 20))
    names = (f"old/{i}" for i in itertools.count())
    try:
        events.start(old)
        first = events.publisher.epoch
        sub.connect(events.publisher.endpoint)
        # A SUB socket joins asynchronously: put until it has seen one of the old store's puts.
        wait_until(lambda: put(old, [next(names)]) or stored(receive()), what="the old store's events")
        put(new, ["new/0", "new/1"])  # before the takeover: told when the service attaches to it
        clock.advance(1.0)
        events.follow(new)
        wait_until(lambda: {"new/0", "new/1"} <= stored(receive()), what="the new store's blocks")
        epoch = events.publisher.epoch
        assert epoch > first
        opened = [b for seq, b in received if seq == epoch]
        assert opened and opened[0].events == [wire.Cleared()]  # the epoch opens with a clear
        # After the last clear, only the new store's blocks.
        last = max(i for i, (_, b) in enumerate(received) if wire.Cleared() in b.events)
        assert stored(received[last:]) == {"new/0", "new/1"}
        events.follow(None)  # deposed: consumers forget
        wait_until(lambda: wire.Cleared() in receive()[-1][1].events, what="a clear once deposed")
    finally:
        events.stop()
        sub.close(0)
