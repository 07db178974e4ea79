"""One engine's cache as the indexer knows it, from the engine's own KV events (vLLM's
BlockStored / BlockRemoved / AllBlocksCleared): a BatchHandler for an EventSubscriber.

An engine names blocks by its own hash (vLLM: SHA-256 over CBOR, seeded by NONE_HASH), which no
one else can recompute; its BlockStored events carry the blocks' tokens and their parent, so each
block is re-hashed here with kvstore's chain (kvstore.blockhash, seed 0, the registered block size,
extra = the LoRA name and the registration's salt), the hash a query computes from its tokens. A
block whose parent was never seen, or that comes without its tokens, cannot be placed and is
counted in `unplaced`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from kvstore import blockhash
from kvstore.events import wire
from kvstore.indexer import media
from kvstore.indexer.table import HashTable, Match

ENGINE_SEED = 0


class EngineCache:
    def __init__(self, block_size: int, salt: str = "") -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self._salt = salt
        self._table = HashTable()
        self._digests: dict[int, bytes] = {}  # engine's hash -> kvstore chain digest
        self._root = blockhash.root(block_size, ENGINE_SEED)
        self._lock = threading.Lock()
        self.unplaced = 0
        self.batches = 0

    # -- BatchHandler --------------------------------------------------------------------------

    def batch(self, seq: int, batch: wire.Batch) -> None:
        with self._lock:
            self.batches += 1
            for event in batch.events:
                if isinstance(event, wire.Stored):
                    self._stored(event)
                elif isinstance(event, wire.Removed):
                    self._removed(event)
                else:
                    self._clear()

    def lost(self) -> None:
        with self._lock:
            self._clear()

    # -- queries -------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> Match:
        with self._lock:
            return self._table.match(hashes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._table)

    # -- under the lock ------------------------------------------------------------------------

    def _stored(self, event: wire.Stored) -> None:
        n = len(event.hashes)
        parent = self._root if event.parent is None else self._digests.get(event.parent)
        size = event.block_size or self.block_size
        if parent is None or size != self.block_size or len(event.token_ids) < n * size:
            self.unplaced += n
            return
        extra = blockhash.extra_key(event.lora_name, self._salt)
        digests = blockhash.chain(event.token_ids[: n * size], size, ENGINE_SEED, extra, parent)
        bit = media.bit(media.normalize(event.medium))
        for engine_hash, digest in zip(event.hashes, digests):
            self._digests[engine_hash] = digest
            self._table.add(blockhash.short(digest), bit)

    def _removed(self, event: wire.Removed) -> None:
        bit = media.bit(media.normalize(event.medium))
        for engine_hash in event.hashes:
            digest = self._digests.get(engine_hash)
            if digest is not None and self._table.remove(blockhash.short(digest), bit):
                del self._digests[engine_hash]

    def _clear(self) -> None:
        self._table.clear()
        self._digests.clear()
