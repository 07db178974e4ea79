"""The KV event publishers registered with the indexer (POST /register): each is consumed by an
EventSubscriber into its own EngineCache until it is unregistered.

A publisher is identified, as in Mooncake's Conductor, by (instance_id, tenant_id, dp_rank);
registering the same identity again replaces the subscription.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from kvstore.events.subscriber import EventSubscriber
from kvstore.indexer.engine_cache import EngineCache

log = logging.getLogger(__name__)
MAX_PUBLISHERS = 1024  # each is a thread and two sockets


@dataclass(frozen=True)
class Registration:
    endpoint: str
    instance_id: str
    model: str
    block_size: int
    dp_rank: int = 0
    tenant_id: str = "default"
    replay_endpoint: str | None = None
    kind: str = "vLLM"
    lora_name: str = ""
    salt: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.instance_id, self.tenant_id, self.dp_rank)

    @property
    def name(self) -> str:
        return f"{self.instance_id}|{self.tenant_id}|{self.dp_rank}"


class Engine:
    """A registered publisher, its subscription and what it has told."""

    def __init__(self, registration: Registration) -> None:
        self.registration = registration
        self.cache = EngineCache(registration.block_size, registration.salt)
        self.subscriber = EventSubscriber(registration.endpoint, self.cache, registration.replay_endpoint)


class Registry:
    def __init__(self) -> None:
        self._engines: dict[tuple[str, str, int], Engine] = {}
        self._lock = threading.Lock()

    def register(self, registration: Registration) -> None:
        """Subscribe to the publisher (connecting is asynchronous: an endpoint nobody serves yet is
        retried by ZMQ)."""
        engine = Engine(registration)
        with self._lock:
            old = self._engines.pop(registration.key, None)
            if old is None and len(self._engines) >= MAX_PUBLISHERS:
                raise ValueError(f"already {MAX_PUBLISHERS} publishers registered: unregister some first")
            self._engines[registration.key] = engine
        if old is not None:
            old.subscriber.stop()
        try:
            engine.subscriber.start()
        except Exception as exc:
            with self._lock:
                self._engines.pop(registration.key, None)
            raise ValueError(f"cannot subscribe to {registration.endpoint!r}: {exc}") from exc
        log.info("indexer: consuming KV events of %s from %s", registration.name, registration.endpoint)

    def unregister(self, instance_id: str, tenant_id: str, dp_rank: int | None = None) -> list[str]:
        """Stop consuming the matching publishers (every dp rank if none is given); their names."""
        with self._lock:
            keys = [k for k in self._engines if k[:2] == (instance_id, tenant_id) and dp_rank in (None, k[2])]
            gone = [self._engines.pop(k) for k in keys]
        for engine in gone:
            engine.subscriber.stop()
        return [e.registration.name for e in gone]

    def engines(self, tenant_id: str, model: str, instance_id: str | None = None) -> list[Engine]:
        with self._lock:
            return [
                e
                for e in self._engines.values()
                if e.registration.tenant_id == tenant_id
                and e.registration.model == model
                and instance_id in (None, e.registration.instance_id)
            ]

    def close(self) -> None:
        with self._lock:
            gone = list(self._engines.values())
            self._engines.clear()
        for engine in gone:
            engine.subscriber.stop()
