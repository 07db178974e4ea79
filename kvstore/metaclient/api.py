"""What every metadata client offers, remote or in process: make a call (kvstore.wire.calls) and
get its reply, or send it now and wait for the reply later.

MetaClient (one service and its standbys), ShardedMetaClient (a store split over shards) and
server.local.LocalMeta (the handlers of a store in this process) all satisfy it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from kvstore.wire.call import Call

R = TypeVar("R")


class MetaApi(Protocol):
    def call(self, req: Call[R], timeout_s: float | None = None, retry_s: float = 0.0) -> R:
        """The reply to `req`; while no service answers, `req` again for up to `retry_s` if it is
        safe to repeat."""
        ...

    def begin(self, req: Call[R], timeout_s: float | None = None) -> Callable[[], R]:
        """Send `req` now; the callable returned waits for its reply."""
        ...
