"""What the metadata service tells the world about the blocks it holds: a block stored in a tier,
a block gone from a tier, everything cleared. MetaState reports each change to its EventSink
under the store's lock, so a sink only records (a publisher sends from its own thread: see
kvstore/events/). The default sink drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvstore.types import Tier


class EventSink(Protocol):
    """Called once per replica: a key with two DRAM replicas is stored in DRAM twice, and losing
    one of them is one removal while the other still serves it (kvstore/events/holdings.py
    counts them)."""

    def stored(self, keys: Sequence[str], tier: Tier) -> None:
        """These keys have one more replica in `tier`: committed, announced, copied or moved there."""

    def removed(self, keys: Sequence[str], tier: Tier) -> None:
        """These keys have one replica fewer in `tier`: removed, evicted, lost with a daemon, or
        moved away."""

    def cleared(self) -> None:
        """Everything is gone (the index was reset)."""


class NoEvents:
    """The sink of a service that publishes nothing."""

    def stored(self, keys: Sequence[str], tier: Tier) -> None:
        pass

    def removed(self, keys: Sequence[str], tier: Tier) -> None:
        pass

    def cleared(self) -> None:
        pass
