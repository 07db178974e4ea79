"""The scheduler side's question to kvstore: how many leading blocks of a prompt it holds whole.

One call per lookup: `match_prefix` over the block keys (a block stored as several objects counts
once all of them are stored), or, for a hybrid model none of whose groups needs the whole prefix,
`exists_many` and each group's own rule (groups.py). A failed call is a miss, and lookups then
pause for `lookup_backoff_s`, so a store that is down costs each request nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from kvstore.client import KVClient, KVStoreError
from kvstore.config import ClientConfig
from kvstore.engines.vllm.config import ConnectorConfig
from kvstore.engines.vllm.groups import GroupLayout

log = logging.getLogger("vllm.kvstore.scheduler")


class Lookup(NamedTuple):
    blocks: int  # leading blocks kvstore holds whole
    failed: bool  # kvstore did not answer (or was failing: not asked)


class StoreLookups:
    """`count(**counters)` is told of every lookup made, failed and skipped."""

    def __init__(
        self,
        config: ConnectorConfig,
        groups: GroupLayout | None,
        count: Callable[..., None],
        client: Any | None = None,
    ) -> None:
        self.config = config
        self.groups = groups
        self._count = count
        self._client = client
        self._skip_until = 0.0

    def client(self) -> KVClient:
        if self._client is None:
            self._client = KVClient(
                self.config.meta,
                ClientConfig(
                    timeout_s=self.config.lookup_timeout_s, transports=self.config.transports, token=self.config.token
                ),
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def stored(self, keys: list[str], per_block: int) -> Lookup:
        """How many leading blocks of `keys` (`per_block` objects each, block-major) are stored."""
        if time.monotonic() < self._skip_until:
            self._count(lookups_skipped=1)
            return Lookup(0, True)
        self._count(lookups=1)
        try:
            if self.groups is not None and not self.groups.needs_whole_prefix:
                return Lookup(self.groups.hit_chunks(self.client().exists_many(keys)), False)
            return Lookup(self.client().match_prefix(keys) // per_block, False)
        except KVStoreError as exc:
            self._count(lookup_failures=1)
            self._skip_until = time.monotonic() + self.config.lookup_backoff_s
            log.warning(
                "kvstore: lookup failed (%s: %s); treating requests as uncached for %.1fs",
                type(exc).__name__,
                exc,
                self.config.lookup_backoff_s,
            )
            return Lookup(0, True)
