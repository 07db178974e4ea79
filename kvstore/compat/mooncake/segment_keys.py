"""The keys a store wrote while it mounted a segment, to remove when it closes
(KVSTORE_MOONCAKE_DROP_ON_CLOSE; settings.py).

In Mooncake a client that mounts a global segment holds objects in it, and closing the client
unmounts the segment: those objects are gone. kvstore's daemons hold every byte, so the layer
gives the same lifetime by remembering what the store wrote: a key counts as the store's when its
put wrote it (not when the key was already stored by someone else), and stops counting when the
store removes it. Approximate where Mooncake spreads one client's puts over other clients'
segments too; kept only when asked for, since it is one entry per key written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable


class SegmentKeys:
    """Store keys (namespace applied). Thread safe."""

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._lock = threading.Lock()

    def add(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(keys)

    def discard(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.difference_update(keys)

    def take(self) -> list[str]:
        """Every key, in order, forgetting them."""
        with self._lock:
            keys, self._keys = sorted(self._keys), set()
        return keys
