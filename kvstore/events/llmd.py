"""The store's KV events in the form llm-d's KV-cache indexer reads: one pool topic per model and
positional events.

llm-d (llm-d-kv-cache, pkg/kvevents) takes the publisher's identity and the model from the topic,
`kv@<pod>@<model>`, and the store's blocks are no pod's: they are published as the pool's,
`kv@pool:<name>@<model>` (the model from the key's namespace `{tenant}/{model}/{layout}`). Its vLLM
adapter decodes each event as a positional array, the tag first, in vLLM's field order:

    BlockStored      [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
                      medium, lora_name]                     (later optional fields omitted)
    BlockRemoved     [tag, block_hashes, medium]
    AllBlocksCleared [tag]

The store never sees tokens, so `token_ids` is empty and there is no parent: llm-d then takes the
block hash as an engine's own and files the block under what that engine's events told it the
hash means. That holds when the keys carry the engine's hashes (the vLLM connector's
`block_names: "vllm"`); blocks named by kvstore's hash are announced but match nothing there.
Keys outside an engine namespace have no model and are not published in this form.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from kvstore.errors import InvalidArgument
from kvstore.events.block_ids import BlockRef
from kvstore.events.wire import MEDIUM

try:
    import msgpack
except ImportError:  # wire.require() says so where events start
    pass

CLEARED_MODEL = ""  # AllBlocksCleared names the pool, no model: llm-d clears a publisher whole


def _p(value: Any) -> bytes:
    out: bytes = msgpack.packb(value)
    return out


class PoolForm:
    """Topics and packed events for pool `name`. Events are built from bytes computed once per
    medium; block hashes are always uint64 (0xcf), as vLLM's ints are."""

    def __init__(self, name: str, block_size: int) -> None:
        if not name or "@" in name:
            raise InvalidArgument(f"KV events pool name must be non-empty and free of '@', got {name!r}")
        self.name = name
        self.prefix = f"kv@pool:{name}@"
        self._topics: dict[str, bytes] = {}
        after_hash: list[Any] = [None, [], block_size, None]  # parent, token_ids, block_size, lora_id
        self._stored = {
            medium: (
                b"\x98" + _p("BlockStored") + b"\x91\xcf",
                b"".join(map(_p, after_hash)) + _p(medium) + _p(None),  # ..., medium, lora_name
            )
            for medium in MEDIUM.values()
        }
        self._removed = {medium: (b"\x93" + _p("BlockRemoved") + b"\x91\xcf", _p(medium)) for medium in MEDIUM.values()}
        self.cleared = b"\x91" + _p("AllBlocksCleared")

    def topic(self, ref: BlockRef) -> bytes | None:
        """The topic of `ref`'s model, or None for a key outside an engine namespace."""
        if ref.namespace is None:
            return None
        model = ref.namespace.split("/", 2)[1]
        topic = self._topics.get(model)
        if topic is None:
            topic = self._topics[model] = (self.prefix + unquote(model)).encode()
        return topic

    @property
    def cleared_topic(self) -> bytes:
        return (self.prefix + CLEARED_MODEL).encode()

    def stored(self, block_hash: int, medium: str) -> bytes:
        head, tail = self._stored[medium]
        return b"".join((head, block_hash.to_bytes(8, "big"), tail))

    def removed(self, block_hash: int, medium: str) -> bytes:
        head, tail = self._removed[medium]
        return b"".join((head, block_hash.to_bytes(8, "big"), tail))
