"""What the router knows of cached prefixes, learned from KV events, never by asking:

    each instance's own cache   vLLM's events (`--kv-events-config` on the server), one
                                subscription per instance; vLLM names blocks by hashes no one else
                                can compute, so the blocks are re-hashed from the tokens the
                                events carry (kvstore.indexer.engine_cache)
    the store                   kvstore's events (the metadata service's `events_port`), per key
                                namespace; the store's block hashes are kvstore.blockhash's chain,
                                which the router computes from the prompt's tokens itself

so that for a prompt's token ids the router can say how many leading tokens each instance holds
and how many kvstore holds, without a call on the request's path. What it knows lags the
instances by an event batch (a scheduler step for vLLM, a few milliseconds for kvstore): a
router that routes on a stale hint costs a recompute, never a wrong answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvstore import blockhash
from kvstore.events.subscriber import EventSubscriber
from kvstore.indexer.engine_cache import ENGINE_SEED, EngineCache
from kvstore.indexer.store_events import StoreEvents

log = logging.getLogger("kvstore.engines.router")


@dataclass(frozen=True)
class EventSource:
    endpoint: str
    replay_endpoint: str | None = None

    @classmethod
    def parse(cls, text: str) -> EventSource:
        """'tcp://host:port' or 'tcp://host:port,tcp://host:replay_port'."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not 1 <= len(parts) <= 2 or not all(p.startswith(("tcp://", "ipc://")) for p in parts):
            raise ValueError(f"a KV event source is ENDPOINT[,REPLAY_ENDPOINT] (tcp://host:port), got {text!r}")
        return cls(parts[0], parts[1] if len(parts) > 1 else None)


class PrefixHits(NamedTuple):
    store_tokens: int  # leading prompt tokens kvstore holds (any tier)
    instance_tokens: dict[str, int]  # per instance URL: leading tokens in its own cache


class PrefixIndex:
    def __init__(self, block_size: int, tenant: str = "default", store_seed: int = 0) -> None:
        if block_size <= 0:
            raise ValueError("the KV block size must be positive")
        self.block_size = block_size
        self.tenant = tenant
        self.store_seed = store_seed
        self._engines: dict[str, tuple[EngineCache, EventSubscriber]] = {}
        self._store: tuple[StoreEvents, EventSubscriber] | None = None

    def watch_instance(self, url: str, source: EventSource) -> None:
        cache = EngineCache(self.block_size)
        sub = EventSubscriber(source.endpoint, cache, source.replay_endpoint).start()
        self._engines[url] = (cache, sub)
        log.info("prefix index: following %s's KV events at %s", url, source.endpoint)

    def watch_store(self, source: EventSource) -> None:
        handler = StoreEvents()
        self._store = (handler, EventSubscriber(source.endpoint, handler, source.replay_endpoint).start())
        log.info("prefix index: following kvstore's KV events at %s", source.endpoint)

    @property
    def instances(self) -> list[str]:
        return list(self._engines)

    def lookup(self, token_ids: Sequence[int], model: str) -> PrefixHits:
        chain = [blockhash.short(d) for d in blockhash.chain(token_ids, self.block_size, ENGINE_SEED)]
        instances = {url: cache.match(chain).blocks * self.block_size for url, (cache, _) in self._engines.items()}
        store = 0
        if self._store is not None:
            store_chain = (
                chain
                if self.store_seed == ENGINE_SEED
                else [blockhash.short(d) for d in blockhash.chain(token_ids, self.block_size, self.store_seed)]
            )
            store = self._store[0].table.match(self.tenant, model, store_chain).blocks * self.block_size
        return PrefixHits(store, instances)

    def stats(self) -> dict[str, Any]:
        """What it knows, for /router/state: blocks per instance and in the store, and the events'
        health (gaps replayed, losses, blocks that came without tokens or parent)."""
        out: dict[str, Any] = {
            "instances": {
                url: {"blocks": len(cache), "unplaced": cache.unplaced, **sub.stats()._asdict()}
                for url, (cache, sub) in self._engines.items()
            }
        }
        if self._store is not None:
            handler, sub = self._store
            out["store"] = {"blocks": len(handler.table), **sub.stats()._asdict()}
        return out

    def close(self) -> None:
        for _, sub in self._engines.values():
            sub.stop()
        if self._store is not None:
            self._store[1].stop()
