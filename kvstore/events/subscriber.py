"""A consumer of KV events in vLLM's format, from vLLM itself (`--kv-events-config`) or from
kvstore's metadata service: a SUB socket, gap detection by sequence number, and replay.

Rules (the same a consumer written for vLLM's events follows):
- seq is one more than the last: deliver it.
- seq jumps ahead: ask the replay endpoint for what was missed and deliver it first; if the replay
  cannot fill the whole gap (no replay endpoint, its ring moved on, a new kvstore epoch, no
  answer in time), the handler is told `lost()`: forget this publisher's blocks, then go on.
- seq goes back (vLLM restarted and counts from 0 again): `lost()`, then go on from there.
Handlers run on the subscriber's thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, NamedTuple, Protocol

from kvstore.events import wire
from kvstore.logs import RateLimited

try:
    import zmq
except ImportError as exc:  # no [events] extra: EventSubscriber says so (the indexer imports this module)
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

log = logging.getLogger(__name__)
_odd = RateLimited(log, 30.0)
POLL_MS = 250


class BatchHandler(Protocol):
    def batch(self, seq: int, batch: wire.Batch) -> None:
        """One batch, in sequence order."""

    def lost(self) -> None:
        """Batches were missed for good: everything known from this publisher may be stale."""


class SubscriberStats(NamedTuple):
    batches: int
    replayed: int
    gaps: int
    lost: int
    undecodable: int
    last_seq: int | None


class EventSubscriber:
    def __init__(
        self,
        endpoint: str,
        handler: BatchHandler,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
    ) -> None:
        wire.require(_MISSING)
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._handler = handler
        self._topic = topic.encode()
        self._replay_timeout_ms = int(replay_timeout_s * 1000)
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 0)  # a consumer that falls behind queues; it does not drop
        self._sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._replay: zmq.Socket[Any] | None = None
        self._last: int | None = None
        self._counts = {"batches": 0, "replayed": 0, "gaps": 0, "lost": 0, "undecodable": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-events-sub {endpoint}", daemon=True)

    def start(self) -> EventSubscriber:
        self._sub.connect(self.endpoint)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._sub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        self._ctx.term()

    def stats(self) -> SubscriberStats:
        c = self._counts
        return SubscriberStats(c["batches"], c["replayed"], c["gaps"], c["lost"], c["undecodable"], self._last)

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(POLL_MS):
                continue
            frames = self._sub.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                _odd.warning(self.endpoint, "KV events from %s: ignored a %d-frame message", self.endpoint, len(frames))
                continue
            try:
                self._receive(wire.seq_of(frames[1]), frames[2])
            except Exception:
                log.exception("KV events from %s: the handler failed", self.endpoint)

    def _receive(self, seq: int, payload: bytes) -> None:
        last = self._last
        if last is not None and seq <= last:
            log.info(
                "KV events from %s: seq went back (%d after %d): the publisher restarted", self.endpoint, seq, last
            )
            self._lose()
        elif last is not None and seq > last + 1:
            self._counts["gaps"] += 1
            self._fill(last + 1, seq)
        self._deliver(seq, payload)

    def _deliver(self, seq: int, payload: bytes) -> None:
        self._last = seq
        try:
            batch = wire.decode_batch(payload)
        except wire.Undecodable as exc:
            self._counts["undecodable"] += 1
            _odd.warning(self.endpoint, "KV events from %s: seq %d undecodable (%s)", self.endpoint, seq, exc)
            return
        self._counts["batches"] += 1
        self._handler.batch(seq, batch)

    def _lose(self) -> None:
        self._counts["lost"] += 1
        self._handler.lost()

    # -- replay ------------------------------------------------------------------------------

    def _fill(self, start: int, upto: int) -> None:
        """Deliver batches [start, upto) from the replay endpoint; lost() for whatever it lacks."""
        replayed = self._ask_replay(start)
        if replayed is None:
            self._lose()
            return
        wanted = [(seq, payload) for seq, payload in replayed if start <= seq < upto]
        if not wanted or wanted[0][0] != start or wanted[-1][0] != upto - 1 or len(wanted) != upto - start:
            self._lose()
        for seq, payload in wanted:
            if self._last is None or seq > self._last:
                self._counts["replayed"] += 1
                self._deliver(seq, payload)

    def _ask_replay(self, start: int) -> list[tuple[int, bytes]] | None:
        if self.replay_endpoint is None:
            return None
        if self._replay is None:
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.connect(self.replay_endpoint)
        sock = self._replay
        sock.send_multipart((b"", wire.seq_bytes(start)))
        out: list[tuple[int, bytes]] = []
        while sock.poll(self._replay_timeout_ms):
            frames = sock.recv_multipart()
            if len(frames) != 4:
                continue
            if frames[2] == wire.END_SEQ:
                return out
            out.append((wire.seq_of(frames[2]), frames[3]))
        # No end marker in time: a fresh socket, so a late answer cannot mix into the next replay.
        log.warning("KV events: no replay from %s in %d ms", self.replay_endpoint, self._replay_timeout_ms)
        sock.close(0)
        self._replay = None
        return None
