"""The thread that turns what the store recorded (EventBuffer) into block transitions for its
listeners: the ZMQ publisher, the indexer's table.

Each drain becomes one call per listener, so a burst of puts becomes one event batch; the thread
then lingers `linger_s` before draining again so that a steady stream of small puts is batched
too (events lag the store by about that much). Keys are parsed and copies counted here, off the
store's lock.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from kvstore.events.block_ids import BlockRef, block_ref
from kvstore.events.buffer import EventBuffer, Op
from kvstore.events.holdings import SHIFT, Holdings
from kvstore.logs import RateLimited
from kvstore.types import Tier

log = logging.getLogger(__name__)
_lost = RateLimited(log, 60.0)
LINGER_S = 0.01
_new = tuple.__new__  # a NamedTuple without its Python-level __new__: one per key committed


class Transition(NamedTuple):
    stored: bool  # False: removed
    ref: BlockRef
    tier: Tier


class FeedListener(Protocol):
    def changed(self, transitions: Sequence[Transition]) -> None:
        """Blocks that entered or left a tier, in the store's order. Called on the feed's thread,
        one listener after another: it must not block for long."""

    def cleared(self) -> None:
        """Forget every block: the store was cleared, or the feed lost changes and what follows
        starts from nothing."""


class BlockFeed:
    def __init__(self, buffer: EventBuffer, listeners: Sequence[FeedListener], linger_s: float = LINGER_S) -> None:
        self.buffer = buffer
        self._listeners = list(listeners)
        self._linger_s = linger_s
        self._holdings = Holdings()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events-feed", daemon=True)
        self.transitions = 0  # published so far (for stats and tests)
        self.dropped = 0

    def start(self) -> BlockFeed:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.buffer.doorbell.ring()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.buffer.close()

    def _run(self) -> None:
        bell = self.buffer.doorbell
        while not self._stop.is_set():
            select.select([bell.read_fd], [], [], 1.0)
            bell.quiet()
            try:
                self.flush()
            except Exception:
                log.exception("KV events: the feed failed on a batch of changes; they are lost")
            self._stop.wait(self._linger_s)
        self.flush()

    def flush(self) -> None:
        """Drain the buffer and hand its transitions to the listeners now (on the feed's thread,
        or instead of starting it: the counts are the thread's alone)."""
        drained = self.buffer.drain()
        pending: list[Transition] = []
        # One pass, locals bound once: this runs for every key the store commits or drops.
        add, remove, append, stored_op = self._holdings.add, self._holdings.remove, pending.append, Op.STORED
        for op, keys, tier in drained.changes:
            if tier is None:  # Op.CLEARED
                self._deliver(pending)
                pending = []
                append = pending.append
                self._clear()
                continue
            stored = op is stored_op
            count, shift = (add if stored else remove), SHIFT[tier]
            for key in keys:
                ref = block_ref(key)
                if count(ref[0], shift):
                    append(_new(Transition, (stored, ref, tier)))
        self._deliver(pending)
        if drained.dropped:
            self.dropped += drained.dropped
            _lost.warning(
                "lost",
                "KV events: the feed fell behind the store and dropped %d changes; consumers are "
                "told to forget every block (AllBlocksCleared) and relearn from new changes",
                drained.dropped,
            )
            self._clear()

    def _deliver(self, transitions: list[Transition]) -> None:
        if not transitions:
            return
        self.transitions += len(transitions)
        for listener in self._listeners:
            try:
                listener.changed(transitions)
            except Exception:
                log.exception("KV events: listener %s failed", type(listener).__name__)

    def _clear(self) -> None:
        self._holdings.clear()
        for listener in self._listeners:
            try:
                listener.cleared()
            except Exception:
                log.exception("KV events: listener %s failed", type(listener).__name__)
