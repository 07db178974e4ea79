"""KVClient: put and get KV blocks; metadata over gRPC, bytes over the best data-plane transport.

Every call is batch-first: `put`, `get`, ... are batches of one. Bytes move straight between the
caller's buffers and the daemons' memory; the client never copies a value it can avoid copying.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from typing import Any, Sequence

from kvstore.client.buffers import byte_view
from kvstore import wire
from kvstore.client.metachannel import MetaChannel
from kvstore.checksum import checksum
from kvstore.config import ClientConfig
from kvstore.errors import (ChecksumMismatch, ErrorCode, InvalidArgument, KVStoreError, TransportError,
                            Unavailable, error_for)
from kvstore.stats import StoreStats
from kvstore.transport import registry
from kvstore.transport.base import Transfer, Transport
from kvstore.types import Grant, SegmentInfo, validate_key
from kvstore.v1 import meta_pb2 as pb

log = logging.getLogger(__name__)


class KVClient:
    def __init__(self, meta_address: str, config: ClientConfig | None = None) -> None:
        self.meta_address = meta_address
        self.config = config or ClientConfig()
        self._preferred = _installed(self.config.transports)
        self._meta = MetaChannel(meta_address, self.config.timeout_s, self.config.fast_lane)
        self._transports: dict[str, Transport] = {}
        self._lock = threading.Lock()
        self._released: list[int] = []    # read leases of finished reads, ended with the next call

    def __enter__(self) -> "KVClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for transport in self._transports.values():
            transport.close()
        self._transports.clear()
        self._meta.close()

    # -- metadata calls ------------------------------------------------------------------------

    def _rpc(self, name: str, request: Any) -> Any:
        return self._meta.call(name, request)

    def exists(self, key: str) -> bool:
        return self.exists_many([key])[0]

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        _validate(keys)
        return list(self._rpc("Exists", pb.ExistsRequest(keys=keys)).exists)

    def match_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys are stored: the cached prefix of a chain of block keys."""
        _validate(keys)
        return self._rpc("MatchPrefix", pb.MatchPrefixRequest(keys=keys)).count

    def remove(self, key: str, force: bool = False) -> None:
        """Delete a key; KeyNotFound if absent, KeyBusy if being written, or being read (a read
        lease runs) unless `force`: then the key goes at once and its space once the lease ends."""
        err = self.remove_many([key], force)[0]
        if err is not None:
            raise err

    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[KVStoreError | None]:
        _validate(keys)
        resp = self._rpc("Remove", pb.RemoveRequest(keys=keys, force=force, released=self._take_released()))
        return [wire.status_error(s) for s in resp.results]

    def stats(self) -> StoreStats:
        return wire.stats_from_pb(self._rpc("Stats", pb.StatsRequest()))

    # -- put -------------------------------------------------------------------------------------

    def put(self, key: str, value: Any) -> bool:
        """Store `value` (bytes-like, numpy array or CPU tensor) under `key`.

        Returns True if written, False if the key was already stored (its bytes are kept).
        """
        return self.put_many([key], [value])[0]

    def put_many(self, keys: Sequence[str], values: Sequence[Any], replica_num: int | None = None) -> list[bool]:
        """Store many values in one round of metadata calls. On any failure the keys that could not
        be written are revoked (never left half-written) and the first error is raised after the
        others are committed."""
        _validate(keys)
        if len(keys) != len(values):
            raise InvalidArgument(f"{len(keys)} keys but {len(values)} values")
        if len(set(keys)) != len(keys):
            raise InvalidArgument("duplicate keys in one put_many")
        views = [byte_view(v, writable=False) for v in values]
        if any(len(v) == 0 for v in views):
            raise InvalidArgument("empty values are not stored")
        deadline = time.monotonic() + self.config.timeout_s
        results, segments = self._put_start(keys, [len(v) for v in views],
                                            replica_num or self.config.replica_num, deadline)
        written = [False] * len(keys)
        errors: dict[int, KVStoreError] = {}
        pending: dict[int, list[Grant]] = {}
        for i, result in enumerate(results):
            if result.status.code == ErrorCode.OK:
                pending[i] = [wire.grant_from_pb(g) for g in result.replicas]
            elif result.status.code != ErrorCode.ALREADY_EXISTS:
                errors[i] = error_for(result.status.code, result.status.message)
        by_segment: dict[str, list[tuple[int, Transfer]]] = defaultdict(list)
        for i, grants in pending.items():
            for g in grants:
                by_segment[g.segment_id].append((i, Transfer(g, views[i])))
        sums: dict[int, int] = {}
        for segment_id, items in by_segment.items():
            try:
                digests = self._transport_for(segments[segment_id]).write(
                    segments[segment_id], [t for _, t in items], deadline)
            except KVStoreError as exc:
                for i, _ in items:
                    errors.setdefault(i, exc)
                continue
            if digests is not None:                  # computed while copying: no second pass
                sums.update((i, d) for (i, _), d in zip(items, digests))
        good = [i for i in pending if i not in errors]
        for i in good:
            if i not in sums:
                sums[i] = checksum(views[i])
        failed = [i for i in pending if i in errors]
        if failed:
            self._rpc("PutRevoke", pb.PutRevokeRequest(keys=[keys[i] for i in failed]))
        if good:
            ended = self._rpc("PutEnd", pb.PutEndRequest(keys=[keys[i] for i in good],
                                                         checksums=[sums[i] for i in good]))
            for i, status in zip(good, ended.results):
                err = wire.status_error(status)
                if err is None:
                    written[i] = True
                else:
                    errors[i] = err
        if errors:
            raise errors[min(errors)]
        return written

    def _put_start(self, keys: Sequence[str], sizes: list[int], replica_num: int,
                   deadline: float) -> tuple[list[Any], dict[str, SegmentInfo]]:
        """PutStart, asking again for keys the service is making room for (retry_after_ms), until
        they are placed or the deadline passes."""
        results: list[Any] = [None] * len(keys)
        segments: dict[str, SegmentInfo] = {}
        todo = list(range(len(keys)))
        while todo:
            resp = self._rpc("PutStart", pb.PutStartRequest(keys=[keys[i] for i in todo],
                                                            sizes=[sizes[i] for i in todo],
                                                            replica_num=replica_num))
            segments.update(wire.segments_by_id(resp.segments))
            retry, wait_ms = [], 0
            for i, result in zip(todo, resp.results):
                results[i] = result
                if result.status.code == ErrorCode.NO_SPACE and result.retry_after_ms:
                    retry.append(i)
                    wait_ms = max(wait_ms, result.retry_after_ms)
            if not retry or time.monotonic() + wait_ms / 1000 > deadline:
                break
            time.sleep(wait_ms / 1000)   # the service said when room will be made: back off that long
            todo = retry
        return results, segments

    # -- pins ------------------------------------------------------------------------------------

    def pin(self, keys: Sequence[str], ttl_s: float) -> list[KVStoreError | None]:
        """Keep stored keys from eviction and tier moves for ttl_s (e.g. a shared system prompt).
        Per key: None, KeyNotFound, or NoSpace when the tier's pin cap is reached."""
        _validate(keys)
        resp = self._rpc("Pin", pb.PinRequest(keys=keys, ttl_ms=int(ttl_s * 1000)))
        return [wire.status_error(s) for s in resp.results]

    def unpin(self, keys: Sequence[str]) -> list[KVStoreError | None]:
        _validate(keys)
        return [wire.status_error(s) for s in self._rpc("Unpin", pb.UnpinRequest(keys=keys)).results]

    # -- get -------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """The values of `keys`; raises KeyNotFound (or another error) for the first that fails."""
        metas = self._get_meta(keys)
        buffers = [bytearray(result.size) for result, _ in metas]   # empty for a failed key
        sizes = self._read(keys, metas, [memoryview(b) for b in buffers], strict=True)
        return [bytes(b) if len(b) == n else bytes(b[:n]) for b, n in zip(buffers, sizes)]

    def get_into(self, key: str, buffer: Any) -> int:
        """Read `key` straight into `buffer` (writable bytes-like, numpy array, CPU tensor);
        returns the number of bytes written at its start."""
        return self.get_many_into([key], [buffer])[0]

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any], strict: bool = True) -> list[Any]:
        """Read each key into its buffer. strict: raise the first error; otherwise return, per key,
        the byte count or the KVStoreError (a miss is KeyNotFound) so callers can recompute."""
        if len(keys) != len(buffers):
            raise InvalidArgument(f"{len(keys)} keys but {len(buffers)} buffers")
        views = [byte_view(b, writable=True) for b in buffers]
        return self._read(keys, self._get_meta(keys), views, strict)

    def _get_meta(self, keys: Sequence[str]) -> list[tuple[Any, dict[str, SegmentInfo]]]:
        _validate(keys)
        resp = self._rpc("Get", pb.GetRequest(keys=keys, released=self._take_released()))
        segments = wire.segments_by_id(resp.segments)
        return [(r, segments) for r in resp.results]

    def _take_released(self) -> list[int]:
        with self._lock:
            ids, self._released = self._released, []
        return ids

    def _read(self, keys: Sequence[str], metas: list, views: list[memoryview], strict: bool) -> list[Any]:
        """Read every key of a Get, then hand its read leases back (with this client's next Get
        or Remove): nothing is copied from those blocks any more."""
        try:
            return self._read_replicas(keys, metas, views, strict)
        finally:
            with self._lock:
                self._released.extend(result.lease_id for result, _ in metas if result.lease_id)

    def _read_replicas(self, keys: Sequence[str], metas: list, views: list[memoryview], strict: bool) -> list[Any]:
        out: list[Any] = [None] * len(keys)
        # Each key tries its replicas in preference order until one read succeeds.
        todo: dict[int, list[tuple[SegmentInfo, Grant]]] = {}
        reach: dict[str, int | None] = {}            # transport preference per segment, this call
        for i, (result, segments) in enumerate(metas):
            if result.status.code != ErrorCode.OK:
                out[i] = error_for(result.status.code, result.status.message)
            elif len(views[i]) < result.size:
                out[i] = InvalidArgument(f"buffer for {keys[i]!r} holds {len(views[i])} bytes; "
                                         f"the value is {result.size}")
            else:
                todo[i] = self._rank_replicas([wire.grant_from_pb(g) for g in result.replicas], segments, reach)
                if not todo[i]:
                    out[i] = TransportError(f"no replica of {keys[i]!r} is reachable over "
                                            f"{', '.join(self._preferred)}")
                    del todo[i]
        deadline = time.monotonic() + self.config.timeout_s
        while todo:
            groups: dict[str, list[int]] = defaultdict(list)
            for i, replicas in todo.items():
                groups[replicas[0][1].segment_id].append(i)
            for segment_id, idxs in groups.items():
                segment = todo[idxs[0]][0][0]
                transfers = [Transfer(todo[i][0][1], views[i][:todo[i][0][1].length]) for i in idxs]
                digests: list[int] | None = None
                try:
                    digests = self._transport_for(segment).read(segment, transfers, deadline)
                    failure = None
                except KVStoreError as exc:
                    failure = exc
                for n, i in enumerate(idxs):
                    grant = todo[i].pop(0)[1]
                    err = failure or self._verify(keys[i], views[i][:grant.length], metas[i][0].checksum,
                                                  None if digests is None else digests[n])
                    if err is None:
                        out[i] = grant.length
                    elif not todo[i]:
                        out[i] = err
                    else:
                        continue
                    del todo[i]
        if strict:
            for r in out:
                if isinstance(r, KVStoreError):
                    raise r
        return out

    def _verify(self, key: str, data: memoryview, expected: int, digest: int | None) -> KVStoreError | None:
        if not self.config.verify_checksums:
            return None
        if (digest if digest is not None else checksum(data)) != expected:
            return ChecksumMismatch(f"{key!r}: bytes read do not match the checksum stored at put; "
                                    "the replica is corrupt; remove the key and put it again")
        return None

    # -- transports ------------------------------------------------------------------------------

    def _rank_replicas(self, grants: list[Grant], segments: dict[str, SegmentInfo],
                       reach: dict[str, int | None]) -> list[tuple[SegmentInfo, Grant]]:
        ranked = []
        for g in grants:
            seg = segments.get(g.segment_id)
            if seg is None:
                continue
            if g.segment_id not in reach:
                reach[g.segment_id] = self._preference(seg)
            if (rank := reach[g.segment_id]) is not None:
                ranked.append((rank, seg, g))
        ranked.sort(key=lambda r: r[0])
        return [(seg, g) for _, seg, g in ranked]

    def _preference(self, segment: SegmentInfo) -> int | None:
        for rank, name in enumerate(self._preferred):
            if segment.endpoint(name) is not None and self._transport(name).can_reach(segment):
                return rank
        return None

    def _transport_for(self, segment: SegmentInfo) -> Transport:
        for name in self._preferred:
            if segment.endpoint(name) is not None and self._transport(name).can_reach(segment):
                return self._transport(name)
        raise TransportError(f"segment {segment.segment_id} offers "
                             f"{[e.transport for e in segment.endpoints]}, none of which this client "
                             f"can reach with {list(self._preferred)}")

    def _transport(self, name: str) -> Transport:
        with self._lock:
            transport = self._transports.get(name)
            if transport is None:
                transport = self._transports[name] = registry.client_class(name).from_config(self.config)
            return transport


def _installed(names: Sequence[str]) -> tuple[str, ...]:
    """The transports of `names` whose libraries are installed, in order. A missing optional one
    is skipped (logged once per process); Unavailable, naming the extras, if none is left."""
    usable, missing = [], []
    for name in names:
        try:
            registry.client_class(name)      # unknown names raise InvalidArgument here
            usable.append(name)
        except Unavailable as exc:
            missing.append(exc)
            if name not in _REPORTED_MISSING:
                _REPORTED_MISSING.add(name)
                log.info("transport %s skipped: %s", name, exc)
    if not usable:
        raise Unavailable("; ".join(str(e) for e in missing))
    return tuple(usable)


_REPORTED_MISSING: set[str] = set()


def _validate(keys: Sequence[str]) -> None:
    if isinstance(keys, (str, bytes)):
        raise InvalidArgument("pass a list of keys, not a single string")
    for key in keys:
        validate_key(key)
