"""The metadata service's KV events and KV indexer, wired to its store: what MetaServer builds
when `events_port` >= 0, or when its admin face is on and serves the indexer.

    store --EventBuffer--> BlockFeed --> ZmqPublisher       (events_port >= 0)
                                     \\-> StoreTable --> Indexer API on the admin face

`GET /events` on the admin face says where the events are published and where they stand.

The sink follows the store that answers (`follow`, from the service's ticker): on Redis a takeover
builds a new store, and a leader deposed has none. A new store is a new epoch, opened with
AllBlocksCleared, then every replica it holds as BlockStored.
"""

from __future__ import annotations

import logging
from typing import Any

from kvstore.admin.http import AdminServer, Response
from kvstore.clock import Clock
from kvstore.config import MetaConfig
from kvstore.events.buffer import EventBuffer
from kvstore.events.feed import BlockFeed, FeedListener
from kvstore.meta.sink import EventSink, NoEvents
from kvstore.meta.store import MetaStore

log = logging.getLogger(__name__)


class ServiceEvents:
    def __init__(self, config: MetaConfig, admin: AdminServer | None, clock: Clock | None = None) -> None:
        from kvstore.indexer.api import IndexerApi
        from kvstore.indexer.store_table import StoreTable

        self._store: MetaStore | None = None
        self._followed = False
        listeners: list[FeedListener] = []
        self.publisher = None
        if config.events_port >= 0:
            from kvstore.events.publisher import ZmqPublisher

            self.publisher = ZmqPublisher(config, clock, pool=config.events_pool)
            listeners.append(self.publisher)
        self.table: StoreTable | None = None
        self.indexer: IndexerApi | None = None
        if admin is not None and config.indexer:
            self.table = StoreTable()
            listeners.append(self.table)
            self.indexer = IndexerApi(self.table)
            self.indexer.mount(admin)
        self.buffer = EventBuffer()
        self.feed = BlockFeed(self.buffer, listeners)
        if admin is not None:
            admin.route("GET", "/events", lambda query, body: Response.json(self.describe()))

    @classmethod
    def wanted(cls, config: MetaConfig, admin: AdminServer | None) -> bool:
        return config.events_port >= 0 or (admin is not None and config.indexer)

    def start(self, store: MetaStore | None) -> ServiceEvents:
        """Open the first epoch and follow `store` (None: a standby, until it is elected)."""
        if self.publisher is not None:
            self.publisher.open()
        self.feed.start()
        self.follow(store)
        return self

    def follow(self, store: MetaStore | None) -> None:
        """Report `store`'s changes from now on, if it is not the one followed already. Another
        store than the last (a takeover) opens a new epoch; None (deposed) clears."""
        if store is self._store and self._followed:
            return
        if self._store is not None:
            attach(self._store, NoEvents())
        if self._followed:
            # Consumers forget the old store; the marker makes the feed forget its copy counts in
            # order, after the old store's last changes.
            if store is not None and self.publisher is not None:
                self.publisher.new_epoch()
            self.buffer.cleared()
        self._store, self._followed = store, True
        if store is not None:
            attach(store, self.buffer)

    def stop(self) -> None:
        if self._store is not None:
            attach(self._store, NoEvents())
        self.feed.stop()
        if self.publisher is not None:
            self.publisher.close()
        if self.indexer is not None:
            self.indexer.close()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"transitions": self.feed.transitions, "dropped": self.feed.dropped}
        if self.publisher is not None:
            out.update(self.publisher.stats()._asdict())
        if self.table is not None:
            out["indexed_blocks"] = len(self.table)
        return out


def attach(store: MetaStore, sink: EventSink) -> None:
    """Have `store` report its block changes to `sink`, starting with every replica it holds."""
    # tenant_call is MetaStore's one "work on the state under the lock" entry point; it changes
    # nothing durable here (changes=False).
    store.tenant_call(lambda state, now: state.attach_events(sink))
