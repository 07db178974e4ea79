"""When a metadata service may change things: never while its journal is failing. A service that
took over from another leader takes changes at once: the space its predecessor's grants can
still reach (its holds, and whatever it frees meanwhile) waits in quarantine until every such
grant has expired, plus the grace (holds.py, MetaStore.restore). Segments loaded at the takeover
and not mounted again by their daemons within heartbeat_ttl_s are then due to be dropped."""

from __future__ import annotations

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
        self._reconcile_until = 0.0  # monotonic; segments loaded but not mounted again by then go

    @property
    def grants_s(self) -> float:
        """How long after a takeover a grant the previous leader signed may still be honoured."""
        return max(self._config.lease_ttl_s, self._config.write_grant_ttl_s)

    @property
    def wait_s(self) -> float:
        """How long after a takeover the previous leader's grants are all past, the grace too."""
        return self.grants_s + GRACE_S

    def took_over(self, mono: float) -> None:
        """A leader took over at `mono`: the segments it loaded are due to be mounted again."""
        self._reconcile_until = mono + self._config.heartbeat_ttl_s

    @property
    def journal_failed(self) -> Unavailable | None:
        failed: Unavailable | None = getattr(self._journal, "failed", None)
        return failed

    def is_open(self) -> bool:
        """Whether changes are taken (and space may be freed, then handed out)."""
        return self.journal_failed is None

    def check(self) -> None:
        """Raise the reason changes are refused now, if they are."""
        if self.journal_failed is not None:
            raise self.journal_failed

    def reconcile_due(self, mono: float) -> bool:
        """True once, when the segments loaded at the takeover must have been mounted again."""
        if self._reconcile_until and mono > self._reconcile_until:
            self._reconcile_until = 0.0
            return True
        return False
