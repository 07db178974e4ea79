"""The metadata service's KV events on ZMQ, as vLLM's ZmqEventPublisher sends them: a PUB socket
of (topic, seq, EventBatch) messages and a ROUTER socket that replays the last batches.

Sequence numbers and epochs. Each batch's seq is one more than the last. An epoch is one run of
the publisher (a service start, or a failover to a new leader): it opens with a batch holding only
AllBlocksCleared, whose seq is the epoch itself, the wall clock in microseconds when it opened, so
seqs keep growing across restarts (a run cannot publish a batch per microsecond). A consumer
written for vLLM sees a restart as a gap, asks the replay endpoint for it, and gets the new epoch
from its AllBlocksCleared on; a consumer that cannot fill a gap forgets the publisher's blocks.

Forms: vLLM's (the default: one topic, `events_topic`, and events as maps) or, given a pool name,
llm-d's (llmd.py: a topic per model, `kv@pool:<name>@<model>`, and positional events). One seq
counts every message, whatever its topic.

Threads: the ROUTER socket is used only by the replay thread; the PUB socket, the seq and the
replay ring are used under one lock (by the feed's thread, and by whoever opens a new epoch).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from kvstore.clock import Clock, SystemClock
from kvstore.config import MetaConfig
from kvstore.events import wire
from kvstore.events.feed import Transition
from kvstore.events.llmd import PoolForm
from kvstore.logs import RateLimited

try:
    import zmq
except ImportError as exc:  # no [events] extra: ZmqPublisher says so
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

log = logging.getLogger(__name__)
_bad_request = RateLimited(log)
MAX_EVENTS_PER_BATCH = 4096  # a mass eviction becomes several messages, not one huge one
PUB_HWM = 100_000


class PublisherStats(NamedTuple):
    endpoint: str
    replay_endpoint: str
    topic: str
    epoch: int
    next_seq: int
    batches: int
    events: int


class ZmqPublisher:
    """A FeedListener that publishes. `open()` binds nothing (the constructor did) but starts the
    replay thread and opens the first epoch. `pool`: publish llm-d's form as that pool's
    (llmd.py) instead of vLLM's on `events_topic`."""

    def __init__(self, config: MetaConfig, clock: Clock | None = None, pool: str = "") -> None:
        wire.require(_MISSING)
        self._clock = clock or SystemClock()
        self._pool = PoolForm(pool, config.events_block_size) if pool else None
        self._topic = self._pool.prefix.encode() if self._pool else config.events_topic.encode()
        self._packer = wire.EventPacker(config.events_block_size)
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, PUB_HWM)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        replay_port = config.events_replay_port
        if replay_port < 0:
            replay_port = config.events_port + 1 if config.events_port > 0 else 0
        try:
            self.endpoint = _bind(self._pub, config.events_host, config.events_port)
            self.replay_endpoint = _bind(self._router, config.events_host, replay_port)
        except OSError:
            self._close_sockets()
            raise
        self._ring: deque[tuple[int, bytes, bytes]] = deque(maxlen=config.events_replay_batches)
        self._lock = threading.Lock()
        self.epoch = 0
        self._next_seq = 0
        self.batches = 0
        self.events = 0
        self._stop = threading.Event()
        self._replayer = threading.Thread(target=self._serve_replays, name="kv-events-replay", daemon=True)

    def open(self) -> ZmqPublisher:
        self._replayer.start()
        self.new_epoch()
        return self

    def new_epoch(self) -> int:
        """Start a new epoch (on becoming leader): consumers forget what the last one said."""
        with self._lock:
            self.epoch = max(int(self._clock.now() * 1_000_000), self._next_seq)
            self._next_seq = self.epoch
            self._send_cleared()
        log.info("KV events: epoch %d on %s (replay %s)", self.epoch, self.endpoint, self.replay_endpoint)
        return self.epoch

    # -- FeedListener ------------------------------------------------------------------------

    def changed(self, transitions: Sequence[Transition]) -> None:
        if self._pool is not None:
            self._changed_in_pool(self._pool, transitions)
            return
        stored, removed, medium = self._packer.stored, self._packer.removed, wire.MEDIUM
        events = [(stored if t.stored else removed)(t.ref.hash, medium[t.tier], t.ref.block) for t in transitions]
        with self._lock:
            self._send_all(self._topic, events)

    def _changed_in_pool(self, pool: PoolForm, transitions: Sequence[Transition]) -> None:
        by_topic: dict[bytes, list[bytes]] = {}
        medium = wire.MEDIUM
        for t in transitions:
            topic = pool.topic(t.ref)
            if topic is not None:
                event = (pool.stored if t.stored else pool.removed)(t.ref.hash, medium[t.tier])
                by_topic.setdefault(topic, []).append(event)
        with self._lock:
            for topic, events in by_topic.items():
                self._send_all(topic, events)

    def cleared(self) -> None:
        with self._lock:
            self._send_cleared()

    # -- sending -----------------------------------------------------------------------------

    def _send_cleared(self) -> None:
        """Under the lock."""
        if self._pool is not None:
            self._send(self._pool.cleared_topic, [self._pool.cleared])
        else:
            self._send(self._topic, [self._packer.cleared])

    def _send_all(self, topic: bytes, events: list[bytes]) -> None:
        """Under the lock: a mass eviction becomes several messages."""
        for start in range(0, len(events), MAX_EVENTS_PER_BATCH):
            self._send(topic, events[start : start + MAX_EVENTS_PER_BATCH])

    def _send(self, topic: bytes, events: list[bytes]) -> None:
        """Under the lock."""
        payload = wire.encode_batch(self._clock.now(), events)
        seq = self._next_seq
        self._next_seq += 1
        self._pub.send_multipart((topic, wire.seq_bytes(seq), payload), copy=False)
        self._ring.append((seq, topic, payload))
        self.batches += 1
        self.events += len(events)

    def _serve_replays(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(250):
                continue
            frames = self._router.recv_multipart()
            try:
                self._replay(frames)
            except zmq.ZMQError as exc:
                _bad_request.warning("send", "KV events: replay to a consumer failed: %s", exc)

    def _replay(self, frames: list[bytes]) -> None:
        # [identity, b"", start]: a REQ or DEALER peer's request; anything else is refused quietly.
        if len(frames) != 3 or frames[1] or len(frames[2]) != 8:
            _bad_request.warning("frame", "KV events: ignored a malformed replay request (%d frames)", len(frames))
            return
        ident, start = frames[0], wire.seq_of(frames[2])
        with self._lock:
            batches = [entry for entry in self._ring if entry[0] >= start]
        for seq, topic, payload in batches:
            self._router.send_multipart((ident, b"", topic, wire.seq_bytes(seq), payload), copy=False)
        self._router.send_multipart((ident, b"", b"", wire.END_SEQ, b""))

    def stats(self) -> PublisherStats:
        with self._lock:
            return PublisherStats(
                self.endpoint,
                self.replay_endpoint,
                self._topic.decode(),
                self.epoch,
                self._next_seq,
                self.batches,
                self.events,
            )

    def close(self) -> None:
        self._stop.set()
        if self._replayer.is_alive():
            self._replayer.join(timeout=5)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(0)
        self._router.close(0)
        self._ctx.term()


def _bind(sock: zmq.Socket[Any], host: str, port: int) -> str:
    try:
        if port == 0:
            port = sock.bind_to_random_port(f"tcp://{host}")
        else:
            sock.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as exc:
        raise OSError(f"KV events: cannot listen on {host}:{port} ({exc})") from exc
    return f"tcp://{host}:{port}"
