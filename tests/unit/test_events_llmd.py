"""The store's KV events in llm-d's form (kvstore/events/llmd.py): pool topics and positional events,
read back with a decoder written from llm-d's vLLM adapter (llm-d-kv-cache,
pkg/kvevents/engineadapter/vllm_adapter.go) and with vLLM's own event classes."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.engines.keys import KeyScheme, engine_name
from kvstore.errors import InvalidArgument
from kvstore.events import wire
from kvstore.events.block_ids import block_ref
from kvstore.events.buffer import EventBuffer
from kvstore.events.feed import BlockFeed, Transition
from kvstore.events.llmd import PoolForm
from kvstore.events.publisher import ZmqPublisher
from kvstore.meta.store import MetaStore
from kvstore.server.events import ServiceEvents, attach
from kvstore.types import Tier
from tests.cluster import wait_until
from tests.meta_helpers import SIGNER, commit, segment

LLAMA = KeyScheme(model="meta-llama/Llama-3.1-8B", layout="bf16-l", block_size=16, tenant="acme")
QWEN = KeyScheme(model="Qwen/Qwen3-0.6B", layout="bf16-l", block_size=16, tenant="acme")


# -- llm-d's decoding, field by field as its vLLM adapter reads a message --------------------------


def _topic(topic: str) -> tuple[str, str]:
    """parseTopic: "kv@<pod-id>@<model-name>" split on '@' into exactly three parts."""
    parts = topic.split("@")
    return (parts[1], parts[2]) if len(parts) == 3 else (topic, "")


def _hash(raw: Any) -> int:
    """getHashAsUint64: an unsigned or signed int as is, bytes by their last 8 (big-endian)."""
    if isinstance(raw, bytes):
        return int.from_bytes(raw[-8:].rjust(8, b"\0"), "big")
    assert isinstance(raw, int)
    return raw & ((1 << 64) - 1)


def _field(fields: list[Any], i: int) -> Any:
    return fields[i] if i < len(fields) else None


def llmd_decode(topic: bytes, payload: bytes) -> tuple[str, str, list[dict[str, Any]]]:
    """(pod, model, events) as llm-d's VLLMAdapter.ParseMessage produces them: the batch an array
    [ts, events, dp_rank?], every event a positional array with its tag first; anything else fails
    the message (llm-d drops it)."""
    pod, model = _topic(topic.decode())
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and isinstance(batch[0], float) and isinstance(batch[1], list)
    events = []
    for fields in batch[1]:
        if not isinstance(fields, list) or not fields or not isinstance(fields[0], str):
            raise ValueError(f"not a positional event: {fields!r}")
        tag = fields[0]
        if tag == "BlockStored":
            if len(fields) < 5:
                raise ValueError("BlockStored: need at least 5 fields")
            events.append(
                {
                    "type": tag,
                    "block_hashes": [_hash(h) for h in fields[1]],
                    "parent": _hash(fields[2]) if fields[2] is not None else 0,
                    "tokens": [int(t) for t in fields[3]],
                    "block_size": int(fields[4]),
                    "lora_id": _field(fields, 5),
                    "device_tier": _field(fields, 6) or "",
                    "lora_name": _field(fields, 7),
                }
            )
        elif tag == "BlockRemoved":
            events.append(
                {"type": tag, "block_hashes": [_hash(h) for h in fields[1]], "device_tier": _field(fields, 2) or ""}
            )
        elif tag == "AllBlocksCleared":
            events.append({"type": tag})
        else:
            raise ValueError(f"unknown vLLM event tag: {tag}")
    return pod, model, events


# -- the form itself -------------------------------------------------------------------------------


def test_llmd_reads_the_pool_form_and_refuses_the_default_one():
    form = PoolForm("kvstore-a", block_size=16)
    ref = block_ref(LLAMA.block_keys(list(range(16)))[0])
    assert form.topic(ref) == b"kv@pool:kvstore-a@meta-llama/Llama-3.1-8B"
    assert form.topic(block_ref("not-an-engine-block")) is None
    payload = wire.encode_batch(1.5, [form.stored(ref.hash, "CPU"), form.removed(ref.hash, "STORAGE"), form.cleared])
    pod, model, events = llmd_decode(form.topic(ref) or b"", payload)
    assert (pod, model) == ("pool:kvstore-a", "meta-llama/Llama-3.1-8B")
    assert events == [
        {
            "type": "BlockStored",
            "block_hashes": [ref.hash],
            "parent": 0,
            "tokens": [],
            "block_size": 16,
            "lora_id": None,
            "device_tier": "CPU",
            "lora_name": None,
        },
        {"type": "BlockRemoved", "block_hashes": [ref.hash], "device_tier": "STORAGE"},
        {"type": "AllBlocksCleared"},
    ]
    # kvstore's own decoder (the router's, the indexer's) reads it too.
    assert wire.decode_batch(payload).events == [
        wire.Stored([ref.hash], None, [], 16, "CPU"),
        wire.Removed([ref.hash], "STORAGE"),
        wire.Cleared(),
    ]
    # The default form (maps, one topic) is what llm-d cannot read: the reason for the option.
    default = wire.encode_batch(1.5, [wire.EventPacker(16).stored(ref.hash, "CPU", ref.block)])
    with pytest.raises(ValueError, match="not a positional event"):
        llmd_decode(b"kv@pod@model", default)
    for bad in ("", "a@b"):
        with pytest.raises(InvalidArgument):
            PoolForm(bad, 16)


def test_vllms_own_classes_read_the_pool_form_field_by_field():
    """vLLM's BlockStored / BlockRemoved / AllBlocksCleared, encoded positionally (msgspec's
    array_like, as vLLM sends them where llm-d reads them), decode the pool form: the fields are
    vLLM's, in vLLM's order. And kvstore decodes what those classes send."""
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    import msgspec

    def positional(cls: type) -> Any:
        """vLLM's class as vLLM sends it where llm-d reads it: the same fields, in an array."""
        return msgspec.defstruct(cls.__name__, [], bases=(cls,), array_like=True, tag=cls.__name__)

    Stored, Removed, Cleared = (
        positional(c) for c in (kv_events.BlockStored, kv_events.BlockRemoved, kv_events.AllBlocksCleared)
    )
    events_type: Any = list[Stored | Removed | Cleared]  # type: ignore[valid-type]
    batch_type = tuple[float, events_type, int]  # EventBatch's positional [ts, events, dp_rank]

    form = PoolForm("p", block_size=32)
    h = (1 << 64) - 5
    payload = wire.encode_batch(2.0, [form.stored(h, "STORAGE"), form.removed(h, "CPU"), form.cleared])
    decoded: Any = msgspec.msgpack.Decoder(type=batch_type).decode(payload)
    _, events, _ = decoded
    stored, removed, cleared = events
    assert (stored.block_hashes, stored.parent_block_hash, stored.token_ids) == ([h], None, [])
    assert (stored.block_size, stored.lora_id, stored.medium, stored.lora_name) == (32, None, "STORAGE", None)
    assert (removed.block_hashes, removed.medium) == ([h], "CPU") and isinstance(cleared, Cleared)

    # vLLM's self-describing shape (tokens and parent given, as its offloading connector sends)
    # through the same classes: kvstore's decoder and llm-d's read it alike.
    sent = kv_events.EventBatch(ts=3.0, events=[Stored([7, 8], 6, list(range(64)), 32, None, "CPU", None)])
    raw = msgspec.msgpack.encode(sent)
    assert wire.decode_batch(raw).events == [wire.Stored([7, 8], 6, list(range(64)), 32, "CPU")]
    _, _, [event] = llmd_decode(b"kv@pod-1@m", raw)
    assert (event["block_hashes"], event["parent"], len(event["tokens"])) == ([7, 8], 6, 64)


# -- published ---------------------------------------------------------------------------------------


class _Sub:
    """A SUB socket as llm-d's subscriber opens one (topic filter "kv@")."""

    def __init__(self, endpoint: str) -> None:
        import zmq

        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.sock.connect(endpoint)
        self.got: list[tuple[bytes, int, bytes]] = []

    def receive(self) -> list[tuple[bytes, int, bytes]]:
        while self.sock.poll(10):
            topic, seq, payload = self.sock.recv_multipart()
            self.got.append((topic, wire.seq_of(seq), payload))
        return self.got

    def close(self) -> None:
        self.sock.close(0)


def _clear_and_receive(pub: ZmqPublisher, sub: _Sub) -> bool:
    """A SUB socket joins asynchronously: publish a clear and see whether it arrived."""
    pub.cleared()
    return bool(sub.receive())


def _replay(endpoint: str, start: int) -> list[tuple[bytes, int, bytes]]:
    import zmq

    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart((b"", wire.seq_bytes(start)))
        out: list[tuple[bytes, int, bytes]] = []
        while True:
            assert dealer.poll(5000), "no replay answer"
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == wire.END_SEQ:
                return out
            out.append((topic, wire.seq_of(seq), payload))
    finally:
        dealer.close(0)


def test_the_publisher_sends_each_models_blocks_on_its_pool_topic_and_replays_them():
    clock = FakeClock(start=500.0)
    pub = ZmqPublisher(MetaConfig(events_port=0, events_block_size=16), clock, pool="kvstore-a").open()
    sub = _Sub(pub.endpoint)
    try:
        # A SUB socket joins asynchronously: clear until it has seen one.
        wait_until(lambda: _clear_and_receive(pub, sub), what="the subscriber to join")
        llama, qwen = (block_ref(k) for k in (LLAMA.block_keys(list(range(16)))[0], QWEN.block_keys([1] * 16)[0]))
        pub.changed(
            [
                Transition(True, llama, Tier.DRAM),
                Transition(True, block_ref("plain-key"), Tier.DRAM),  # no model: not published
                Transition(True, qwen, Tier.SSD),
                Transition(False, llama, Tier.DRAM),
            ]
        )
        wanted = {b"kv@pool:kvstore-a@meta-llama/Llama-3.1-8B", b"kv@pool:kvstore-a@Qwen/Qwen3-0.6B"}
        wait_until(lambda: wanted <= {t for t, _, _ in sub.receive()}, what="two models' batches")
        by_model: dict[str, list[dict[str, Any]]] = {}
        for topic, _, payload in sub.got:
            pod, model, events = llmd_decode(topic, payload)
            assert pod == "pool:kvstore-a"
            by_model.setdefault(model, []).extend(events)
        assert by_model[""] and all(e == {"type": "AllBlocksCleared"} for e in by_model[""])  # pool-wide
        assert [(e["type"], e["block_hashes"], e["device_tier"]) for e in by_model["meta-llama/Llama-3.1-8B"]] == [
            ("BlockStored", [llama.hash], "CPU"),
            ("BlockRemoved", [llama.hash], "CPU"),
        ]
        assert [(e["type"], e["block_hashes"], e["device_tier"]) for e in by_model["Qwen/Qwen3-0.6B"]] == [
            ("BlockStored", [qwen.hash], "STORAGE")
        ]
        replayed = _replay(pub.replay_endpoint, pub.epoch)
        assert set(sub.got) <= set(replayed)  # every message as sent, its topic included
        assert pub.stats().topic == "kv@pool:kvstore-a@"
    finally:
        sub.close()
        pub.close()


def test_blocks_a_vllm_connector_names_by_vllms_hashes_reach_llmd_as_vllms_own_hashes():
    """block_names "vllm": the connector keys blocks by vLLM's block hashes; a commit of those
    keys in the store comes out of the pool publisher carrying exactly the hashes vLLM's own KV
    events carry for those blocks (maybe_convert_block_hash), which llm-d has learned from the
    engines and so can file the store's copy under."""
    utils = pytest.importorskip("vllm.v1.core.kv_cache_utils")
    from types import SimpleNamespace

    from vllm.utils.hashing import sha256_cbor

    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.metadata import NamingHandshake
    from kvstore.engines.vllm.scheduler import SchedulerSide

    utils.init_none_hash(sha256_cbor)
    tokens = list(range(1000, 1000 + 3 * 16 + 7))
    vllm_hashes, parent = [], None
    for i in range(3):
        parent = utils.hash_block_tokens(sha256_cbor, parent, tokens[16 * i : 16 * (i + 1)])
        vllm_hashes.append(parent)
    request = SimpleNamespace(
        request_id="r", prompt_token_ids=tokens, block_hashes=vllm_hashes, mm_features=[], kv_transfer_params=None
    )

    config = ConnectorConfig.from_extra({"meta": "unused:1", "block_names": "vllm"}, LLAMA.model)
    sched = SchedulerSide(config, 16, load=True, save=True)  # naming only: no store call
    scheme = KeyScheme(LLAMA.model, "bf16-l-vllmnames", 16, config.tenant)
    sched.set_naming(
        {0: NamingHandshake(scheme.model, scheme.layout, 16, config.tenant, 0, None, scheme.fingerprint, 1)}
    )
    keys = sched.scheme.object_keys(sched._hashes(request)) if sched.scheme else []
    assert keys == [scheme.key(engine_name(h)) for h in vllm_hashes]

    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("dram", "d1", Tier.DRAM, 1 << 20))
    buffer = EventBuffer()
    pub = ZmqPublisher(MetaConfig(events_port=0, events_block_size=16), FakeClock(start=9.0), pool="p").open()
    feed = BlockFeed(buffer, [pub])
    attach(store, buffer)
    sub = _Sub(pub.endpoint)
    try:
        wait_until(lambda: _clear_and_receive(pub, sub), what="the subscriber to join")
        commit(store, keys, store.put_start(keys, [4096] * len(keys), 1).results)
        feed.flush()
        wait_until(lambda: any(t != b"kv@pool:p@" for t, _, _ in sub.receive()), what="the stored blocks")
        [(topic, _, payload)] = [m for m in sub.got if m[0] != b"kv@pool:p@"]
        pod, model, events = llmd_decode(topic, payload)
        assert (pod, model) == ("pool:p", LLAMA.model)
        vllm_sends = [utils.maybe_convert_block_hash(h) for h in vllm_hashes]  # what vLLM's events carry
        assert [e["block_hashes"][0] for e in events] == vllm_sends
        assert all(e["tokens"] == [] and e["device_tier"] == "CPU" for e in events)
    finally:
        sub.close()
        pub.close()
        buffer.close()
        sched.close()


def test_the_service_publishes_llmds_form_when_its_config_names_a_pool():
    with pytest.raises(InvalidArgument, match="'@'"):
        MetaConfig(events_port=0, events_pool="a@b")
    service = ServiceEvents(MetaConfig(events_port=0, events_pool="kvstore-a"), None, FakeClock())
    try:
        assert service.publisher is not None and service.publisher.stats().topic == "kv@pool:kvstore-a@"
    finally:
        service.stop()
    default = ServiceEvents(MetaConfig(events_port=0), None, FakeClock())
    try:
        assert default.publisher is not None and not default.publisher.stats().topic.startswith("kv@pool:")
    finally:
        default.stop()
