"""vLLM's KV event format (vllm/distributed/kv_events.py), written and read without vLLM.

A message is three ZMQ frames: topic, the batch's sequence number (8 bytes, big-endian) and a
msgpack `EventBatch`: an array [ts, events, data_parallel_rank]. Each event is a map tagged by
"type" (msgspec's tagged-struct encoding): BlockStored {block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, lora_name, ...}, BlockRemoved {block_hashes, medium, ...},
AllBlocksCleared {}. Decoders built on msgspec ignore fields they do not know, so kvstore adds
`object_key` (the store key, as Mooncake's master publisher does) without breaking vLLM's classes.
EventPacker writes kvstore's events; decode_batch reads anyone's (vLLM's, kvstore's).

The replay endpoint (a ROUTER socket) takes a request [b"", start_seq (8 bytes)] and answers each
buffered batch with seq >= start_seq as [b"", topic, seq, payload], then [b"", b"", END_SEQ, b""].
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstore.errors import Unavailable
from kvstore.types import Tier

try:
    import msgpack
except ImportError as exc:  # no [events] extra: the types still import (the indexer's own table needs no more)
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

END_SEQ = (-1).to_bytes(8, "big", signed=True)
# vLLM's names (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE in vllm.distributed.kv_events).
MEDIUM = {Tier.GPU: "GPU", Tier.DRAM: "CPU", Tier.SSD: "STORAGE"}
_LOW64 = (1 << 64) - 1


class Stored(NamedTuple):
    hashes: list[int]
    parent: int | None
    token_ids: list[int]
    block_size: int
    medium: str | None
    lora_name: str | None = None
    object_key: str | None = None


class Removed(NamedTuple):
    hashes: list[int]
    medium: str | None
    object_key: str | None = None


class Cleared(NamedTuple):
    pass


Event = Stored | Removed | Cleared


class Batch(NamedTuple):
    ts: float
    events: list[Event]
    dp_rank: int | None


class Undecodable(ValueError):
    """A payload that is not a vLLM EventBatch."""


def require(missing: ImportError | None = None) -> None:
    """Where KV events start (ZmqPublisher, EventSubscriber): Unavailable, naming the [events]
    extra, if msgpack or the caller's pyzmq (`missing`) did not import."""
    if cause := missing or _MISSING:
        raise Unavailable(f"KV events need pyzmq and msgpack ({cause}): pip install 'kvcachestore[events]'") from cause


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_of(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)


class EventPacker:
    """kvstore's events as msgpack, assembled from bytes computed once: the publisher packs one
    event per block the store commits or drops, and msgpack.packb of a nine-field dict per event
    was most of what events cost the service. The bytes are exactly a msgpack map (the tests
    decode them with msgpack and with vLLM's classes); block hashes are always uint64 (0xcf).

    BlockStored {type, parent_block_hash: nil, token_ids: [], block_size, lora_id: nil,
    lora_name: nil, medium, block_hashes: [hash], object_key}: one block, no parent (the store
    holds blocks, not the sequences they came from). BlockRemoved {type, medium, block_hashes,
    object_key}. AllBlocksCleared {type}.
    """

    def __init__(self, block_size: int) -> None:
        def p(value: Any) -> bytes:
            out: bytes = msgpack.packb(value)
            return out

        self._stored = {
            medium: b"\x89"
            + b"".join(map(p, ("type", "BlockStored", "parent_block_hash", None, "token_ids", [], "block_size")))
            + p(block_size)
            + b"".join(map(p, ("lora_id", None, "lora_name", None, "medium", medium, "block_hashes")))
            + b"\x91\xcf"
            for medium in MEDIUM.values()
        }
        self._removed = {
            medium: b"\x84" + b"".join(map(p, ("type", "BlockRemoved", "medium", medium, "block_hashes"))) + b"\x91\xcf"
            for medium in MEDIUM.values()
        }
        self._key = p("object_key")
        self.cleared = b"\x81" + p("type") + p("AllBlocksCleared")

    def stored(self, block_hash: int, medium: str, object_key: str) -> bytes:
        data = object_key.encode("utf-8", "surrogatepass")
        return b"".join((self._stored[medium], block_hash.to_bytes(8, "big"), self._key, _str_head(len(data)), data))

    def removed(self, block_hash: int, medium: str, object_key: str) -> bytes:
        data = object_key.encode("utf-8", "surrogatepass")
        return b"".join((self._removed[medium], block_hash.to_bytes(8, "big"), self._key, _str_head(len(data)), data))


def encode_batch(ts: float, events: Sequence[bytes], dp_rank: int = 0) -> bytes:
    """An EventBatch [ts, events, dp_rank] around events already packed (EventPacker)."""
    n = len(events)
    head = (
        bytes((0x90 | n,))
        if n < 16
        else (b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big"))
    )
    rank: bytes = msgpack.packb(dp_rank)
    return b"".join((b"\x93\xcb", struct.pack(">d", ts), head, *events, rank))


_SHORT_HEADS = [bytes((0xA0 | n,)) for n in range(32)] + [b"\xd9" + bytes((n,)) for n in range(32, 256)]


def _str_head(n: int) -> bytes:
    """The msgpack header of an n-byte string."""
    if n < 256:
        return _SHORT_HEADS[n]
    return b"\xda" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdb" + n.to_bytes(4, "big")


def decode_batch(payload: bytes) -> Batch:
    """Raises Undecodable for anything but an EventBatch; events of types it does not know are
    skipped (a newer publisher may send more)."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise Undecodable(f"not msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise Undecodable("an EventBatch is an array [ts, events, dp_rank]")
    try:
        events = [e for e in map(_event, raw[1]) if e is not None]
        return Batch(float(raw[0]), events, int(raw[2]) if len(raw) > 2 and raw[2] is not None else None)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise Undecodable(f"malformed event: {exc}") from exc


def _event(raw: Any) -> Event | None:
    if isinstance(raw, list):  # older vLLM: array-like events, the tag first
        raw = _from_array(raw)
    kind = raw.get("type")
    if kind == "BlockStored":
        parent = raw.get("parent_block_hash")
        return Stored(
            [as_hash(h) for h in raw["block_hashes"]],
            None if parent is None else as_hash(parent),
            [int(t) for t in raw.get("token_ids") or ()],
            int(raw.get("block_size") or 0),
            raw.get("medium"),
            raw.get("lora_name"),
            raw.get("object_key"),
        )
    if kind == "BlockRemoved":
        return Removed([as_hash(h) for h in raw["block_hashes"]], raw.get("medium"), raw.get("object_key"))
    if kind == "AllBlocksCleared":
        return Cleared()
    return None


_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _from_array(raw: list[Any]) -> dict[str, Any]:
    names = _ARRAY_FIELDS.get(raw[0], ()) if raw else ()
    return {"type": raw[0] if raw else None, **dict(zip(names, raw[1:]))}


def as_hash(value: int | bytes) -> int:
    """vLLM sends its block hashes as 64-bit ints by default and as hash bytes with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0; both become the int vLLM would have sent."""
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & _LOW64
    return int(value) & _LOW64
