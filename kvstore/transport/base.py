"""The data-plane interface.

Client side (`Transport`): move bytes between caller memory and granted ranges of a daemon's
segment. Daemon side (`TransportServer`): accept such requests for the daemon's segments, checking
every grant. Implementations register by name in registry.py and are imported lazily.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, NoReturn, TypeVar

from kvstore.clock import Clock, SystemClock, now_ms
from kvstore.config import ClientConfig, DaemonConfig
from kvstore.errors import InvalidArgument, PermissionDenied
from kvstore.grant import GrantSigner, local_piece
from kvstore.observe import NO_TRANSFERS, TransferObserver
from kvstore.storage.base import SegmentStorage
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo


class Written(NamedTuple):
    """What a write returns: per transfer, the checksum of its bytes computed while copying (or
    None: not computed), and the daemon's receipt for its grant (None: a transport whose daemon
    sees no request, shm and mooncake)."""

    checksums: list[int] | None
    receipts: list[bytes] | None


NOT_WRITTEN = Written(None, None)


@dataclass(frozen=True)
class Transfer:
    """One block to move: the grant names the remote range, `buffer` the local bytes.

    For a write, buffer is the source; for a read, the destination. len(buffer) == grant.length.
    """

    grant: Grant
    buffer: memoryview


def checked_view(segment: SegmentInfo, t: Transfer, mode: GrantMode, transport: str, now_ms: int) -> memoryview:
    """t.buffer as flat bytes, after the checks every client side makes before moving a byte:
    the grant's (check_grant), and the buffer is C-contiguous (writable for a read) and exactly
    the grant's size."""
    g, buf = t.grant, t.buffer
    check_grant(segment, g, mode, now_ms)
    if not buf.c_contiguous or (mode is GrantMode.READ and buf.readonly):
        raise InvalidArgument(f"{transport} transfers need C-contiguous buffers, writable for a read")
    if buf.nbytes != g.length:
        raise InvalidArgument(f"buffer of {buf.nbytes} bytes does not match grant [{g.offset}, +{g.length})")
    return buf.cast("B")


def check_grant(segment: SegmentInfo, g: Grant, mode: GrantMode, now_ms: int) -> None:
    """The grant is for this segment and direction, lies inside the segment and has not expired."""
    if g.segment_id != segment.segment_id or g.mode != mode:
        raise InvalidArgument(f"grant for {g.segment_id}/{g.mode.name} used for {segment.segment_id}/{mode.name}")
    if g.offset + g.length > segment.capacity:
        raise PermissionDenied(f"grant range [{g.offset}, +{g.length}) is outside the segment")
    if g.expires_ms < now_ms:
        # The space may already belong to another key: writing could corrupt it, reading return it.
        again = "put" if mode is GrantMode.WRITE else "get"
        raise PermissionDenied(f"{mode.name.lower()} grant expired {now_ms - g.expires_ms} ms ago: {again} again")


_Fields = TypeVar("_Fields")


def _first_repeated(grants: Sequence[Grant]) -> Grant:
    """The first grant whose MAC an earlier one in `grants` has (there must be one)."""
    seen: set[bytes] = set()
    for g in grants:
        if g.mac in seen:
            return g
        seen.add(g.mac)
    raise ValueError("no grant is repeated")


class Transport(ABC):
    """Client side of one transport. Thread safe; holds connections/mappings for reuse."""

    name: ClassVar[str]

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        self.config = config or ClientConfig()
        self.clock = clock or SystemClock()  # grants' expiry is judged by this clock

    @classmethod
    def from_config(cls, config: ClientConfig, clock: Clock | None = None) -> Transport:
        """The transport as a client with `config` uses it."""
        return cls(config, clock)

    def now_ms(self) -> int:
        return now_ms(self.clock)

    def can_reach(self, segment: SegmentInfo) -> bool:
        """Whether this transport can reach `segment` from here (cheap; no I/O beyond a stat)."""
        return segment.endpoint(self.name) is not None

    def address_of(self, segment: SegmentInfo, parse: Callable[[str], _Fields]) -> _Fields | None:
        """parse(address) of the segment's endpoint on this transport; None if it offers none or
        the address does not parse (ValueError): such a segment cannot be reached."""
        ep = segment.endpoint(self.name)
        if ep is None:
            return None
        try:
            return parse(ep.address)
        except ValueError:
            return None

    @abstractmethod
    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> Written:
        """Write every transfer's buffer into its granted range; raise TransportError,
        PermissionDenied or InvalidArgument on failure (then any subset may have been written).
        `deadline` is a time.monotonic() value. Returns the buffers' checksums where computed
        while copying (cheaper than a second pass) and the daemon's receipts where it gives them."""

    def write_pieces(
        self, segment: SegmentInfo, grant: Grant, pieces: Sequence[tuple[int, memoryview]], deadline: float
    ) -> Written:
        """Write each (offset, bytes) piece of one LOCAL grant (a region's, kvstore/client/regions.py)
        into [offset, +its size); as `write` otherwise. Here, as a transfer per piece."""
        return self.write(segment, [Transfer(local_piece(grant, o, b.nbytes), b) for o, b in pieces], deadline)

    @abstractmethod
    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int] | None:
        """Fill every transfer's buffer from its granted range; errors and the returned
        checksums (of the bytes read) as for write."""

    def forget(self, segment_id: str) -> None:
        """Drop cached state (connections, mappings) for a segment that went away."""

    def close(self) -> None:
        """Release everything this transport holds."""


class GrantChecker:
    """What a daemon-side server asks before touching segment bytes. Thread safe.

    A WRITE grant is taken once: a second request with it is refused, so no grant can rewrite a
    value after its writer committed it (and the receipt for the first write tells the service
    the grant is spent). Taken grants are remembered until they expire."""

    def __init__(
        self,
        signer: GrantSigner,
        segments: Callable[[str], SegmentStorage | None],
        clock: Clock | None = None,
        observer: TransferObserver = NO_TRANSFERS,
    ) -> None:
        self._signer = signer
        self._segments = segments
        self.clock = clock or SystemClock()
        self.observer = observer  # told of every refusal, by reason
        self._taken: dict[bytes, int] = {}  # MAC of a taken write grant -> its expiry (ms)
        # One entry per request that took grants, ordered by the latest expiry among them: the
        # entries at the front name grants that can all be forgotten, so pruning costs what it drops.
        self._expiring: list[tuple[int, int, tuple[bytes, ...]]] = []  # (expiry ms, seq, MACs)
        self._seq = itertools.count()
        # Grants expiring before this may have been forgotten: a request that checked one before it
        # expired but reaches the take only after it was forgotten must not take it again.
        self._forgotten_before = 0
        self._lock = threading.Lock()  # shared by all of a daemon's transports: held briefly

    def check(self, grant: Grant, mode: GrantMode) -> SegmentStorage:
        """The segment the grant is for, or PermissionDenied (a WRITE grant is taken: use
        check_all to take a request's grants together)."""
        return self.check_all([grant], mode)[0]

    def check_all(self, grants: Sequence[Grant], mode: GrantMode) -> list[SegmentStorage]:
        """The segment each grant is for, after checking every one; PermissionDenied for the
        first that fails, and then none of a WRITE request's grants is taken."""
        now = now_ms(self.clock)
        placed = []
        for grant in grants:
            seg = self._segments(grant.segment_id)
            if seg is None:
                self.observer.refused(mode, "unknown_segment")
                raise PermissionDenied(f"segment {grant.segment_id!r} is not served by this daemon")
            try:
                self._signer.check(grant, mode, now, seg.capacity)
            except PermissionDenied:
                self.observer.refused(mode, "expired" if grant.expires_ms < now else "invalid")
                raise
            placed.append(seg)
        if mode is GrantMode.WRITE:
            self._take(grants, now)
        return placed

    def _take(self, grants: Sequence[Grant], now: int) -> None:
        """Take a WRITE request's grants, all or none; PermissionDenied if one is taken already,
        twice in the request, or may have been forgotten."""
        # What is O(grants) and private to the request is done before the shared lock.
        fresh = {g.mac: g.expires_ms for g in grants}
        if len(fresh) < len(grants):
            self._refuse(_first_repeated(grants), "reused")
        if not fresh:
            return
        macs = tuple(fresh)
        first_expiry, last_expiry = min(fresh.values()), max(fresh.values())
        with self._lock:
            # The check and the insert stay under one hold: two requests with the same grant
            # must not both find it free.
            if first_expiry < self._forgotten_before:
                refused = min(grants, key=lambda g: g.expires_ms), "expired"
            elif not self._taken.keys().isdisjoint(macs):
                refused = next(g for g in grants if g.mac in self._taken), "reused"
            else:
                self._taken.update(fresh)
                heapq.heappush(self._expiring, (last_expiry, next(self._seq), macs))
                self._prune(now)
                return
        self._refuse(*refused)

    def _prune(self, now: int) -> None:
        """Forget the grants of requests whose every grant expired before `now` (lock held)."""
        while self._expiring and self._expiring[0][0] < now:
            last_expiry, _, macs = heapq.heappop(self._expiring)
            for mac in macs:
                del self._taken[mac]
            self._forgotten_before = last_expiry + 1  # popped in expiry order: only ever grows

    def _refuse(self, grant: Grant, reason: str) -> NoReturn:
        self.observer.refused(GrantMode.WRITE, reason)
        if reason == "expired":
            raise PermissionDenied(f"write grant for [{grant.offset}, +{grant.length}) of {grant.segment_id} expired")
        raise PermissionDenied(
            f"write grant for [{grant.offset}, +{grant.length}) of {grant.segment_id} was used "
            "already: a grant writes once; put the key again"
        )

    def receipt(self, grant: Grant) -> bytes:
        """The receipt for a write grant whose bytes landed (for the writer's PutEnd)."""
        return self._signer.receipt(grant)

    def deadline(self, grants: Sequence[Grant]) -> float:
        """The time.monotonic() by which a request on `grants` must have moved every byte: the
        first grant's expiry (after it, the space may be handed to another key)."""
        left_ms = min(g.expires_ms for g in grants) - now_ms(self.clock) if grants else 0
        return time.monotonic() + max(0, left_ms) / 1000


class TransportServer(ABC):
    """Daemon side of one transport. Every request that touches segment bytes goes through
    checker.check first, and reports what it moved to `observer` (the daemon sets it)."""

    name: ClassVar[str]
    observer: TransferObserver = NO_TRANSFERS

    @abstractmethod
    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        """Not serving yet: start() begins."""

    @abstractmethod
    def start(self) -> None:
        """Begin serving (bind listeners, register memory). Returns once ready."""

    @abstractmethod
    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        """The endpoint clients use to reach `segment`, or None if this transport can't serve it."""

    def add_segment(self, segment: SegmentStorage) -> None:
        """Serve `segment` (register its memory if the transport needs to). Called after start()
        for every segment the daemon holds, before endpoint() is asked for it."""

    @abstractmethod
    def stop(self) -> None:
        """Stop serving and release resources; open connections are closed."""
