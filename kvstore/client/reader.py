"""The client's get: where each key's replicas are (the location cache, else a Get under a read
lease), then the bytes straight from a replica's daemon into the caller's buffer, verified by
checksum.

Each key tries its replicas in preference order until one read succeeds; a read from a replica
that has another one behind it is bounded by a deadline scaled to its bytes, so a stopped daemon
costs one such deadline before the next replica is tried. A read from a cached location (no
lease; see locations.py) is always verified, and one that fails its check is asked for again;
if that one misses, the bytes the stale read left in the buffer are zeroed. Read leases, LRU
touches of cache hits, and the segments whose daemon failed a read go back to the service with
the client's next Get or Remove, or after at most `FLUSH_S` without one (a background thread).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from kvstore.checksum import checksum
from kvstore.client.locations import EXPIRY_MARGIN_S, LocationCache
from kvstore.client.transports import Transports
from kvstore.clock import now_ms
from kvstore.config import ClientConfig
from kvstore.errors import ChecksumMismatch, ErrorCode, InvalidArgument, KVStoreError, PermissionDenied, TransportError
from kvstore.metaclient.sharded import ShardedMetaClient
from kvstore.results import GetReply, GetResult
from kvstore.transport.base import Transfer
from kvstore.types import Grant, SegmentInfo
from kvstore.wire.calls import Get
from kvstore.wire.packed import ROWS

log = logging.getLogger(__name__)
FLUSH_S = 1.0
LOCATE_KEYS = 256  # keys per Get of a large get_many_into, the next in flight while one is read
PIPELINE_READ_S = 0.5  # ... while a run's read takes less than this
MAX_TOUCHES = 16384  # pending LRU touches kept; beyond, the oldest are dropped (recency only)
_STALE = (ChecksumMismatch, TransportError, PermissionDenied)  # what a cached location can run into


class Located(NamedTuple):
    result: GetResult
    segments: Mapping[str, SegmentInfo]
    cached: bool = False  # from the location cache: no lease, verify and ask again if it fails


class Reader:
    """Thread safe."""

    def __init__(self, meta: ShardedMetaClient, transports: Transports, config: ClientConfig) -> None:
        self._meta = meta
        self._transports = transports
        self._config = config
        self.client_id = secrets.token_hex(8)  # read leases are bound to it
        self.cache = LocationCache(config.location_cache_entries, config.location_cache_ttl_s)
        self._lock = threading.Lock()
        self._released: list[int] = []  # read leases of finished reads, ended with the next call
        self._failed: set[str] = set()  # segments whose daemon failed a read, reported likewise
        self._touched: dict[str, None] = {}  # cache hits, in order: LRU touches for the service
        self._flusher: _Flusher | None = None

    def close(self) -> None:
        if self._flusher is not None:
            self._flusher.stop()

    # -- where the keys are ------------------------------------------------------------------------

    def locate(self, keys: Sequence[str]) -> list[Located]:
        """Each key's location: from the cache where it has one, the rest in one Get (no keys: a
        Get that only hands back this client's leases and touches)."""
        if not keys:
            self._fetch(keys)
            return []
        return self._begin_locate(keys, in_flight=False)()

    def _begin_locate(self, keys: Sequence[str], in_flight: bool = True) -> Callable[[], list[Located]]:
        """locate(keys), its Get sent now (made now, without `in_flight`); what is returned waits
        for the answer."""
        now = time.monotonic()
        cache = self.cache
        found: list[Located | None] = []
        for key in keys:
            hit = cache.get(key, now) if cache.capacity else None
            found.append(None if hit is None else Located(hit.result, hit.segments, True))
        missing = [i for i, f in enumerate(found) if f is None]
        asked = [keys[i] for i in missing]
        wait = self._begin_fetch(asked) if missing and in_flight else None
        fetched = self._fetch(asked) if missing and not in_flight else []

        def located() -> list[Located]:
            for i, result in zip(missing, fetched if wait is None else wait(), strict=True):
                found[i] = result
            return [f for f in found if f is not None]

        return located

    def _fetch(self, keys: Sequence[str]) -> list[Located]:
        request, lost = self._get_request(keys)
        try:
            reply = self._meta.call(request)
        except KVStoreError:
            lost()
            raise
        return self._located(keys, reply)

    def _begin_fetch(self, keys: Sequence[str]) -> Callable[[], list[Located]]:
        """_fetch(keys), the Get sent now; what is returned waits for its answer."""
        request, lost = self._get_request(keys)
        try:
            wait = self._meta.begin(request)
        except KVStoreError:
            lost()
            raise

        def fetched() -> list[Located]:
            try:
                reply = wait()
            except KVStoreError:
                lost()
                raise
            return self._located(keys, reply)

        return fetched

    def _get_request(self, keys: Sequence[str]) -> tuple[Get, Callable[[], None]]:
        """A Get of `keys` carrying this client's pending leases, touches and failed segments, and
        what puts them back if the call fails (the next call carries them; a lease ended twice is
        refused quietly)."""
        released, failed, touched = self.take_released(), self._take_failed(), self._take_touched()

        def lost() -> None:
            with self._lock:
                self._failed.update(failed)
            self._note(released, touched)

        return Get(keys, released, self._transports.host, self.client_id, failed, touched, packed=ROWS), lost

    def _located(self, keys: Sequence[str], reply: GetReply) -> list[Located]:
        if len(keys) != len(reply.results):
            raise ValueError(f"a Get of {len(keys)} keys answered {len(reply.results)} results")
        self.cache.put_many(keys, reply.results, reply.segments, now_ms(self._transports.clock))
        return [Located(r, reply.segments) for r in reply.results]

    def forget(self, keys: Sequence[str]) -> None:
        """Drop cached locations (the client removed these keys)."""
        self.cache.drop(keys)

    def take_released(self) -> list[int]:
        with self._lock:
            ids, self._released = self._released, []
        return ids

    def _take_failed(self) -> list[str]:
        with self._lock:
            failed, self._failed = sorted(self._failed), set()
        return failed

    def _take_touched(self) -> list[str]:
        with self._lock:
            touched, self._touched = list(self._touched), {}
        return touched

    def _note(self, released: list[int], touched: list[str]) -> None:
        with self._lock:
            self._released += released
            for key in touched:
                self._touched.pop(key, None)
                self._touched[key] = None
            while len(self._touched) > MAX_TOUCHES:
                del self._touched[next(iter(self._touched))]
            start = self._flusher is None and bool(self._released or self._touched)
            if start:
                self._flusher = _Flusher(self._flush)
        if start and self._flusher is not None:
            self._flusher.start()

    def _flush(self) -> None:
        """Hand back what no call carried: a Get of no keys."""
        with self._lock:
            idle = not (self._released or self._touched or self._failed)
        if not idle:
            self._fetch([])

    # -- reading -----------------------------------------------------------------------------------

    def get(self, keys: Sequence[str], views: list[memoryview], strict: bool) -> list[Any]:
        """locate() and read() the keys, LOCATE_KEYS at a time with the next run's Get in flight
        while this run is read: the service locates one run while this thread copies another.
        Only while reads are quick (under PIPELINE_READ_S a run): the next run's grants age while
        this one is read, and a run whose grants aged too far is located again."""
        if len(keys) <= LOCATE_KEYS:
            return self.read(keys, self.locate(keys), views, strict)
        runs = [slice(n, n + LOCATE_KEYS) for n in range(0, len(keys), LOCATE_KEYS)]
        out: list[Any] = []
        took = 0.0  # seconds the last run's read took
        pending: Callable[[], list[Located]] | None = self._begin_locate(keys[runs[0]])
        try:
            for n, run in enumerate(runs):
                if pending is None:
                    located = self.locate(keys[run])
                else:
                    wait, pending = pending, None
                    located = wait()
                    if n and _expiring(located, now_ms(self._transports.clock) + (2 * took + EXPIRY_MARGIN_S) * 1000):
                        self._note(_leases(located), [])
                        located = self.locate(keys[run])
                if n + 1 < len(runs) and took < PIPELINE_READ_S:
                    pending = self._begin_locate(keys[runs[n + 1]])
                began = time.monotonic()
                out += self.read(keys[run], located, views[run], strict=False)
                took = time.monotonic() - began
        finally:
            if pending is not None:  # a run's read failed: the next one's answer is still taken
                try:
                    self._note(_leases(pending()), [])
                except KVStoreError:
                    pass
        if strict:
            for r in out:
                if isinstance(r, KVStoreError):
                    raise r
        return out

    def read(
        self,
        keys: Sequence[str],
        located: list[Located],
        views: list[memoryview],
        strict: bool,
        resize: Callable[[int, int], memoryview] | None = None,
    ) -> list[Any]:
        """Read every located key into its view. A key whose cached location failed is located
        afresh and read again (into `resize(i, size)` when given: get() sizes its buffers to the
        value). Read leases go back with this client's next call: nothing is copied from those
        blocks any more."""
        # whatever happens next; a cached location's lease was handed back after its first read
        released = _leases(located)
        touched: list[str] = []
        try:
            out = self._read_replicas(keys, located, views)
            stale = [i for i, loc in enumerate(located) if loc.cached and isinstance(out[i], _STALE)]
            touched += [keys[i] for i, loc in enumerate(located) if loc.cached and i not in stale]
            if stale:
                released += self._read_again(keys, located, views, out, stale, resize)
        finally:
            self._note(released, touched)
        if strict:
            for r in out:
                if isinstance(r, KVStoreError):
                    raise r
        return out

    def _read_again(
        self,
        keys: Sequence[str],
        located: list[Located],
        views: list[memoryview],
        out: list[Any],
        stale: list[int],
        resize: Callable[[int, int], memoryview] | None,
    ) -> list[int]:
        """Locate and read the keys at `stale` afresh; returns their read leases."""
        self.cache.drop([keys[i] for i in stale])
        fresh = self._fetch([keys[i] for i in stale])
        for i, loc in zip(stale, fresh, strict=True):
            if resize is not None and loc.result.code is ErrorCode.OK and loc.result.size != len(views[i]):
                views[i] = resize(i, loc.result.size)
        redo = self._read_replicas([keys[i] for i in stale], fresh, [views[i] for i in stale])
        for i, result in zip(stale, redo, strict=True):
            out[i] = result
            if isinstance(result, KVStoreError) and resize is None:
                dirty = min(located[i].result.size, len(views[i]))
                views[i][:dirty] = bytes(dirty)  # what the stale read left may be another key's bytes
        return [loc.result.lease_id for loc in fresh if loc.result.lease_id]

    def _read_replicas(self, keys: Sequence[str], located: list[Located], views: list[memoryview]) -> list[Any]:
        out: list[Any] = [None] * len(keys)
        todo: dict[int, list[tuple[SegmentInfo, Grant]]] = {}
        reach: dict[str, int | None] = {}  # transport preference per segment, this call
        for i, (result, segments, _) in enumerate(located):
            if result.code is not ErrorCode.OK:
                out[i] = result.error()
            elif len(views[i]) < result.size:
                out[i] = InvalidArgument(
                    f"buffer for {keys[i]!r} holds {len(views[i])} bytes; the value is {result.size}"
                )
            else:
                todo[i] = self._transports.rank(result.grants, segments, reach)
                if not todo[i]:
                    preferred = ", ".join(self._transports.preferred)
                    out[i] = TransportError(f"no replica of {keys[i]!r} is reachable over {preferred}")
                    del todo[i]
        deadline = time.monotonic() + self._config.timeout_s
        while todo:
            groups: dict[str, list[int]] = defaultdict(list)
            for i, replicas in todo.items():
                groups[replicas[0][1].segment_id].append(i)
            for idxs in groups.values():
                self._read_group(keys, located, views, todo, idxs, deadline, out)
        return out

    def _read_group(
        self,
        keys: Sequence[str],
        located: list[Located],
        views: list[memoryview],
        todo: dict[int, list[tuple[SegmentInfo, Grant]]],
        idxs: list[int],
        deadline: float,
        out: list[Any],
    ) -> None:
        """Read the keys `idxs` from their first remaining replica (all in one segment)."""
        segment = todo[idxs[0]][0][0]
        transfers = [Transfer(todo[i][0][1], views[i][: todo[i][0][1].length]) for i in idxs]
        if all(len(todo[i]) > 1 for i in idxs):  # each has another replica to fall back on
            budget = self._config.transfer_budget_s(sum(t.grant.length for t in transfers))
            deadline = min(deadline, time.monotonic() + budget)
        digests: list[int] | None = None
        failure: KVStoreError | None = None
        try:
            digests = self._transports.for_segment(segment).read(segment, transfers, deadline)
        except KVStoreError as exc:
            failure = exc
            if isinstance(exc, TransportError) and not located[idxs[0]].cached:
                with self._lock:
                    self._failed.add(segment.segment_id)
        for n, i in enumerate(idxs):
            grant = todo[i].pop(0)[1]
            verify = self._config.verify_checksums or located[i].cached  # optimistic reads always are
            digest = None if digests is None else digests[n]
            err = failure or (
                self._verify(keys[i], views[i][: grant.length], located[i][0].checksum, digest) if verify else None
            )
            if err is None:
                out[i] = grant.length
            elif not todo[i] or located[i].cached:  # a stale location: the caller asks again
                out[i] = err
            else:
                continue
            del todo[i]

    def _verify(self, key: str, data: memoryview, expected: int, digest: int | None) -> KVStoreError | None:
        if (digest if digest is not None else checksum(data)) != expected:
            return ChecksumMismatch(
                f"{key!r}: bytes read do not match the checksum stored at put; "
                "the replica is corrupt; remove the key and put it again"
            )
        return None


class _Flusher:
    """A daemon thread that calls `flush` every FLUSH_S until stopped (errors are logged: the
    next call carries what this one could not)."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvstore-client-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            try:
                self._flush()
            except KVStoreError as exc:
                log.debug("handing back read leases and touches failed (the next call carries them): %s", exc)


def _leases(located: list[Located]) -> list[int]:
    """The read leases of these locations (cached ones hold none)."""
    return [x.result.lease_id for x in located if x.result.lease_id and not x.cached]


def _expiring(located: list[Located], before_ms: float) -> bool:
    """Whether a grant of a location fetched (not cached) runs out before `before_ms`."""
    return any(g.expires_ms < before_ms for x in located if not x.cached for g in x.result.grants)
