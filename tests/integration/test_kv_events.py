"""The metadata service's KV events across real processes, read by consumers written for vLLM's
events: vLLM's own classes decode them; a subscriber cut off by a network partition sees the gap
and fills it from the replay endpoint; a restarted service opens a new epoch. And kvstore's
subscriber follows vLLM's own publisher the same way."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from typing import Any

import pytest
import zmq

from kvstore import blockhash
from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.keys import KeyScheme
from kvstore.errors import KVStoreError
from kvstore.events import wire
from kvstore.events.block_ids import block_ref
from kvstore.events.subscriber import EventSubscriber
from tests.cluster import found, wait_until
from tests.tcp_relay import Relay
from tests.vllm.harness import free_port

kv_events = pytest.importorskip("vllm.distributed.kv_events", reason="vLLM's event classes are the reference")
msgspec = pytest.importorskip("msgspec")

EVENTS_ENV = {"KVSTORE_META_EVENTS_PORT": "0", "KVSTORE_LOG_LEVEL": "INFO"}
LINE = re.compile(r"KV events: epoch (\d+) on (tcp://\S+) \(replay (tcp://\S+)\)")
SCHEME = KeyScheme(model="tiny", layout="f32-l", block_size=4)


def events_of(proc):
    """(epoch, endpoint, replay endpoint) from the service's log (it starts publishing before it
    prints its readiness line)."""
    epoch, endpoint, replay = found(LINE, "".join(proc.lines)).groups()
    return int(epoch), endpoint, replay


class VllmStyleConsumer:
    """A consumer as one writes it for vLLM's events (vLLM's examples/online_serving/
    kv_events_subscriber.py): SUB, vLLM's msgspec classes, replay on a gap. Replays go through a
    DEALER: a REQ socket takes only the first of the replies (with vLLM's publisher too)."""

    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(replay_endpoint)
        self.decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
        self.batches: dict[int, Any] = {}  # vLLM's KVEventBatch
        self.last = -1
        self.gaps: list[tuple[int, int]] = []

    def poll(self, timeout_ms: int = 100) -> None:
        while self.sub.poll(timeout_ms):
            _, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if self.last >= 0 and seq > self.last + 1:
                self.gaps.append((self.last + 1, seq))
                self._replay(self.last + 1)
            self._take(seq, payload)
            timeout_ms = 0

    def _replay(self, start: int) -> None:
        self.replay.send_multipart((b"", start.to_bytes(8, "big")))
        while self.replay.poll(5000):
            _, _, seq_bytes, payload = self.replay.recv_multipart()
            if seq_bytes == wire.END_SEQ:
                return
            self._take(int.from_bytes(seq_bytes, "big"), payload)
        raise AssertionError("no end of replay")

    def _take(self, seq: int, payload: bytes) -> None:
        if seq not in self.batches:
            self.batches[seq] = self.decoder.decode(payload)
        self.last = max(self.last, seq)

    def events(self, since: int = 0) -> list[Any]:
        return [e for seq in sorted(self.batches) if seq >= since for e in self.batches[seq].events]

    def stored_keys(self) -> dict[int, str]:
        return {e.block_hashes[0]: e.medium for e in self.events() if isinstance(e, kv_events.BlockStored)}

    def close(self) -> None:
        self.ctx.destroy(0)


def put_until_seen(client: KVClient, consumer: VllmStyleConsumer, tag: str) -> None:
    """Put fresh keys until the consumer gets the event of one: a SUB socket joins
    asynchronously, and a partitioned one reconnects on its own schedule."""
    n = 0

    def seen() -> bool:
        nonlocal n
        key = f"{tag}/{n}"
        n += 1
        client.put(key, b"x" * 64)
        consumer.poll(50)
        return any(
            block_ref(key).hash in e.block_hashes for e in consumer.events() if isinstance(e, kv_events.BlockStored)
        )

    wait_until(seen, what=f"{tag}: the consumer to receive")


def test_a_consumer_written_for_vllm_reads_the_services_events_and_replays_a_gap(cluster):
    proc, meta = cluster.meta({**EVENTS_ENV, "KVSTORE_META_ADMIN_PORT": "0"})
    epoch, endpoint, replay = events_of(proc)
    admin = found(r"admin \(HTTP\) on (\S+)", "".join(proc.lines)).group(1)
    with urllib.request.urlopen(f"http://{admin}/events", timeout=10) as resp:
        described = json.loads(resp.read())
    assert (described["endpoint"], described["replay_endpoint"], described["epoch"]) == (endpoint, replay, epoch)
    cluster.daemon(meta, "64MiB")
    relay = Relay(int(endpoint.rsplit(":", 1)[1]))
    steady = VllmStyleConsumer(endpoint, replay)
    cut_off = VllmStyleConsumer(relay.endpoint, replay)
    try:
        with KVClient(meta, ClientConfig()) as client:
            put_until_seen(client, steady, "warm-up")
            put_until_seen(client, cut_off, "warm-up-2")
            tokens = list(range(24))
            hashes = SCHEME.block_hashes(tokens)
            client.put_many(SCHEME.object_keys(hashes[:3]), [b"a" * 512] * 3)
            client.put_many(SCHEME.object_keys(hashes[3:], [0, 1]), [b"b" * 256] * 6)  # per-layer parts

            relay.cut()  # the partition: what is published now never reaches cut_off
            client.remove_many(SCHEME.object_keys(hashes[:1]))
            client.put_many([f"while-cut/{i}" for i in range(5)], [b"c" * 64] * 5)
            put_until_seen(client, steady, "while-cut/seen")  # all of it sent (and dropped) before the heal
            relay.heal()
            put_until_seen(client, cut_off, "after-heal")

            def steady_caught_up() -> bool:
                steady.poll()
                return steady.last >= cut_off.last

            wait_until(steady_caught_up, what="the steady consumer")
            steady.poll()

        assert cut_off.gaps, "the partition should have cost the consumer some batches"
        first = min(cut_off.batches)
        assert cut_off.events(first) == steady.events(first)  # the replay filled the gap exactly
        assert epoch in steady.batches or min(steady.batches) > epoch

        by_hash = steady.stored_keys()
        for h in hashes:  # each engine block once, whatever its parts: its chain hash, in DRAM
            assert by_hash[blockhash.short(h)] == kv_events.MEDIUM_CPU
        stored = [e for e in steady.events() if isinstance(e, kv_events.BlockStored)]
        assert len([e for e in stored if e.block_hashes[0] in {blockhash.short(h) for h in hashes}]) == 6
        assert all(e.parent_block_hash is None and e.token_ids == [] for e in stored)
        removed = [e for e in steady.events() if isinstance(e, kv_events.BlockRemoved)]
        assert [e.block_hashes for e in removed] == [[blockhash.short(hashes[0])]]
        assert removed[0].medium == kv_events.MEDIUM_CPU
    finally:
        steady.close()
        cut_off.close()
        relay.close()


class Recording:
    """A BatchHandler that keeps everything, for kvstore's own subscriber."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, wire.Batch]] = []
        self.lost_count = 0
        self.lock = threading.Lock()

    def batch(self, seq, batch):
        with self.lock:
            self.batches.append((seq, batch))

    def lost(self):
        with self.lock:
            self.lost_count += 1

    def seqs(self) -> list[int]:
        with self.lock:
            return [seq for seq, _ in self.batches]

    def stored(self, since: int = 0) -> set[int]:
        with self.lock:
            return {
                h
                for seq, b in self.batches
                if seq >= since
                for e in b.events
                if isinstance(e, wire.Stored)
                for h in e.hashes
            }


def test_a_restarted_service_opens_a_new_epoch_that_consumers_follow(cluster):
    proc, meta = cluster.meta(EVENTS_ENV)
    epoch, endpoint, replay = events_of(proc)
    cluster.daemon(meta, "64MiB")
    record = Recording()
    sub = EventSubscriber(endpoint, record, replay).start()
    hashes = SCHEME.block_hashes(list(range(8)))
    keys = SCHEME.object_keys(hashes)
    try:
        with KVClient(meta, ClientConfig()) as client:
            n = 0

            def joined() -> bool:
                nonlocal n
                client.put(f"warm/{n}", b"x")
                n += 1
                return bool(record.seqs())

            wait_until(joined, what="the subscriber to join")
            client.put_many(keys, [b"k" * 128] * 2)
            wait_until(lambda: {blockhash.short(h) for h in hashes} <= record.stored(), what="the blocks' events")
            before = record.seqs()[-1]

            proc.kill()  # kill -9: no goodbye on the wire
            port = meta.rsplit(":", 1)[1]
            env = {
                **EVENTS_ENV,
                "KVSTORE_META_EVENTS_PORT": endpoint.rsplit(":", 1)[1],
                "KVSTORE_META_EVENTS_REPLAY_PORT": replay.rsplit(":", 1)[1],
            }
            proc2, _ = cluster.meta(env, "--port", port)
            epoch2, _, _ = events_of(proc2)
            assert epoch2 > before >= epoch  # seqs keep growing across the restart

            # The new service knows nothing of the old one's DRAM blocks (in-memory metadata); the
            # daemon mounts its segment again. The subscriber sees the jump at the next batch it
            # gets, finds the old epoch's end gone, forgets (lost), and follows the new epoch from
            # its AllBlocksCleared on (replayed).
            def relearned() -> bool:
                try:
                    client.put_many(keys, [b"k" * 128] * 2)
                except KVStoreError:
                    pass  # until the daemon has mounted its segment again
                return {blockhash.short(h) for h in hashes} <= record.stored(since=epoch2)

            wait_until(relearned, timeout=60, what="the new epoch's announcements")
            seqs = record.seqs()
            assert epoch2 in seqs and seqs == sorted(seqs)
            assert record.lost_count >= 1
            with record.lock:
                opening = dict(record.batches)[epoch2]
            assert opening.events == [wire.Cleared()]
    finally:
        sub.stop()


def test_kvstores_subscriber_follows_vllms_own_publisher_through_a_partition():
    # vLLM binds only wildcard endpoints ("tcp://*:PORT"); it cannot report a port it chose.
    pub_port, replay_port = free_port(), free_port()
    publisher = kv_events.ZmqEventPublisher(0, endpoint=f"tcp://*:{pub_port}", replay_endpoint=f"tcp://*:{replay_port}")
    relay = Relay(pub_port)
    record, direct = Recording(), Recording()
    sub = EventSubscriber(relay.endpoint, record, f"tcp://127.0.0.1:{replay_port}").start()
    # Not through the relay: when it has the batches published during the cut, vLLM's sending
    # thread has sent them all, and the heal cannot let one through.
    direct_sub = EventSubscriber(f"tcp://127.0.0.1:{pub_port}", direct, f"tcp://127.0.0.1:{replay_port}").start()

    def publish(i: int) -> None:
        publisher.publish(
            kv_events.KVEventBatch(
                ts=time.time(),
                events=[
                    kv_events.BlockStored(
                        block_hashes=[i],
                        parent_block_hash=None,
                        token_ids=[i] * 4,
                        block_size=4,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                    )
                ],
            )
        )

    try:
        sent = 0

        def joined() -> bool:
            nonlocal sent
            publish(sent)
            sent += 1
            return bool(record.seqs()) and bool(direct.seqs())

        wait_until(joined, what="the subscribers to join")
        relay.cut()
        for _ in range(20):
            publish(sent)
            sent += 1
        wait_until(lambda: sent - 1 in direct.stored(), what="the cut's batches to be sent")  # the last of them
        relay.heal()
        cut_at = record.seqs()[-1]
        wait_until(lambda: joined() and record.seqs()[-1] > cut_at + 20, what="the subscriber to come back")
        seqs = record.seqs()
        assert seqs == list(range(seqs[0], seqs[-1] + 1))  # no hole: the replay filled the partition
        assert sub.stats().gaps >= 1 and sub.stats().replayed >= 20
        assert record.lost_count == 0
    finally:
        sub.stop()
        direct_sub.stop()
        relay.close()
        publisher.shutdown()
