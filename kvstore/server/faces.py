"""The faces of the metadata service beyond its calls, built from its config: metrics and the
history of samples (always: it also logs daemons coming and going), the HTTP admin face with the
dashboard and the KV indexer's routes, and KV events. MetaServer (server/meta.py) starts and stops
them with the service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from kvstore.admin.http import AdminLimits, AdminServer, Handler
from kvstore.clock import Clock
from kvstore.config import MetaConfig
from kvstore.meta.ha import Stores
from kvstore.results import StoreStats
from kvstore.server.events import ServiceEvents

if TYPE_CHECKING:
    from kvstore.metrics.history import History
    from kvstore.metrics.meta import ServiceMetrics


def _current_stats(stores: Stores) -> Callable[[], StoreStats | None]:
    """The statistics of the store that answers at the moment of the call (what metrics and the
    dashboard read): a takeover swaps the store, and a standby has none (None)."""

    def stats() -> StoreStats | None:
        store = stores.current()
        if store is None:
            return None
        unchecked = bool(getattr(stores, "durability_gap", ""))
        return replace(store.stats(), durability_unchecked=True) if unchecked else store.stats()

    return stats


def _observability(config: MetaConfig, stats: Callable[[], StoreStats | None]) -> tuple[ServiceMetrics | None, History]:
    """The service's metrics (None when off) and its history of samples (always: it also logs
    daemons coming and going, and eviction pressure)."""
    from kvstore.metrics.history import History

    metrics = None
    if config.metrics:
        from kvstore.metrics.meta import ServiceMetrics

        metrics = ServiceMetrics(stats)
    return metrics, History(stats, metrics.lookups if metrics else dict, config.high_watermark)


class Faces:
    """The service's metrics (None when off) and history now; its admin face and KV events when
    asked (they need the service's guard and routes)."""

    def __init__(self, config: MetaConfig, stores: Stores, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.stats = _current_stats(stores)
        self.metrics, self.history = _observability(config, self.stats)

    def admin_face(self, guard: Callable[[str], None], invariants: Handler) -> AdminServer | None:
        """The HTTP admin face (None when admin_port is off): /metrics, the dashboard, and the
        operator's /debug/invariants, every route but the page guarded by `guard`."""
        config = self.config
        if config.admin_port < 0:
            return None
        limits = AdminLimits(config.admin_request_timeout_s, config.admin_max_connections)
        admin = AdminServer(config.admin_host, config.admin_port, guard, limits)
        # An O(N) walk under the store's lock: the operator's call only, as the writes are.
        admin.route("GET", "/debug/invariants", invariants, guarded=True)
        from kvstore.dashboard.routes import mount

        registry, lookups = (self.metrics.registry, self.metrics.lookups) if self.metrics else (None, dict)
        mount(admin, self.stats, self.history, registry, lookups)
        return admin

    def events(self, admin: AdminServer | None) -> ServiceEvents | None:
        """KV events (and the indexer's routes on `admin`), when configured."""
        return ServiceEvents(self.config, admin, self.clock) if ServiceEvents.wanted(self.config, admin) else None
