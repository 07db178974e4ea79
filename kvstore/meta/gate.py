"""When a metadata service may change things: never while its journal is failing, and, after it
took over from another leader, only once every grant that leader may have signed has expired
(plus the grace). Segments loaded at the takeover and not mounted again by their daemons within
heartbeat_ttl_s are then due to be dropped."""

from __future__ import annotations

import math

from kvstore.clock import Clock
from kvstore.config import MetaConfig
from kvstore.errors import Unavailable
from kvstore.meta.journal import Journal
from kvstore.meta.state import GRACE_S


class WriteGate:
    def __init__(self, config: MetaConfig, clock: Clock, journal: Journal) -> None:
        self._config = config
        self._clock = clock
        self._journal = journal
        self._open_at = 0.0  # monotonic; a service that took over waits out the grants before
        self._reconcile_until = 0.0  # monotonic; segments loaded but not mounted again by then go

    @property
    def wait_s(self) -> float:
        """How long a service that takes over waits before it allocates space: until every grant
        the previous leader may have signed has expired, plus the grace."""
        return max(self._config.lease_ttl_s, self._config.write_grant_ttl_s) + GRACE_S

    def took_over(self, mono: float, first: bool = False) -> None:
        """A leader took over at `mono`; `first`: no leader ever signed a grant before it."""
        self._open_at = mono if first else mono + self.wait_s
        self._reconcile_until = mono + self._config.heartbeat_ttl_s

    @property
    def journal_failed(self) -> Unavailable | None:
        failed: Unavailable | None = getattr(self._journal, "failed", None)
        return failed

    def is_open(self, mono: float) -> bool:
        """Whether changes are taken (and space may be freed, then handed out)."""
        return self.journal_failed is None and self._open_at <= mono

    def check(self) -> None:
        """Raise the reason changes are refused now, if they are."""
        if self.journal_failed is not None:
            raise self.journal_failed
        mono = self._clock.monotonic()
        if self._open_at > mono:
            since = mono - (self._open_at - self.wait_s)
            raise Unavailable(
                f"this metadata service took over {since:.1f} s ago and opens for writes in "
                f"{self._open_at - mono:.1f} s (earlier grants must expire first): retry then",
                retry_after_ms=math.ceil((self._open_at - mono) * 1000),
            )

    def reconcile_due(self, mono: float) -> bool:
        """True once, when the segments loaded at the takeover must have been mounted again."""
        if self._reconcile_until and mono > self._reconcile_until:
            self._reconcile_until = 0.0
            return True
        return False
