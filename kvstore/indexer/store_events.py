"""The store's blocks as a remote consumer learns them: kvstore's KV events (a BatchHandler for an
EventSubscriber) into a StoreTable. Each event names its store key (`object_key`), which gives
the namespace; events of keys that name no engine block, or from publishers that send no key
(vLLM's own), are skipped.
"""

from __future__ import annotations

from kvstore.events import wire
from kvstore.events.block_ids import block_ref
from kvstore.indexer import media
from kvstore.indexer.store_table import StoreTable


class StoreEvents:
    def __init__(self, table: StoreTable | None = None) -> None:
        self.table = table or StoreTable()
        self.skipped = 0

    def batch(self, seq: int, batch: wire.Batch) -> None:
        for event in batch.events:
            if isinstance(event, wire.Cleared):
                self.table.cleared()
                continue
            namespace = block_ref(event.object_key).namespace if event.object_key else None
            if namespace is None:
                self.skipped += 1
                continue
            medium = media.normalize(event.medium)
            for block_hash in event.hashes:
                self.table.apply(isinstance(event, wire.Stored), namespace, block_hash, medium)

    def lost(self) -> None:
        self.table.cleared()
