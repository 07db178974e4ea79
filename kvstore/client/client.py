"""KVClient: put and get KV blocks; metadata from the service, bytes over the best data-plane
transport.

Every call is batch-first: `put`, `get`, ... are batches of one. Bytes move straight between the
caller's buffers and the daemons' memory; the client never copies a value it can avoid copying.
Tensors in device (CUDA) memory are the one exception: they are staged through pinned host memory
(kvstore.client.staging), checksums verified on the host side before a byte reaches the device.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from kvstore import tokens
from kvstore.client.buffers import byte_view, plain_views
from kvstore.client.outbytes import new_bytes
from kvstore.client.reader import Reader
from kvstore.client.regions import RegionPool
from kvstore.client.staging import HostStaging
from kvstore.client.transports import Transports
from kvstore.client.writer import Writer
from kvstore.clock import Clock, SystemClock
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.metaclient.client import MetaClient
from kvstore.metaclient.sharded import ShardedMetaClient, client_for
from kvstore.results import GetReply, KeyInfo, KeyListing, StoreStats
from kvstore.tls import TlsFiles
from kvstore.transport.base import Transport
from kvstore.types import validate_keys
from kvstore.wire.calls import Describe, Exists, Get, ListKeys, MatchPrefix, Pin, Release, Remove, Stats, Unpin

if TYPE_CHECKING:
    from kvstore.metrics.client import ClientMetrics
    from kvstore.metrics.links import LinkProbe, LinkStats


class KVClient:
    def __init__(
        self,
        meta_address: str,
        config: ClientConfig | None = None,
        clock: Clock | None = None,
        staging: HostStaging | None = None,
    ) -> None:
        self.meta_address = meta_address
        self.config = config or ClientConfig()
        clock = clock or SystemClock()
        self._staging = staging or HostStaging(self.config.staging_bytes)
        self.metrics = _client_metrics(self.config, clock)
        self._transports = Transports(self.config, clock, self.metrics)
        cfg = self.config
        tls = TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_ca, cfg.tls_server_name)
        base = MetaClient(meta_address, cfg.timeout_s, cfg.fast_lane, tokens.client_token(cfg.token), tls)
        self._meta = client_for(base)  # routes by shard when the store has several
        self._reader = Reader(self._meta, self._transports, self.config)
        self._region_pool = self._regions()
        self._writer = Writer(self._meta, self._transports, self.config, self._region_pool)
        self._probe = _start_probe(self.metrics, self._transports, self.config)
        self._closed = False

    def _regions(self) -> RegionPool | None:
        """Regions for small puts, where this client writes over shm first."""
        cfg = self.config
        if not cfg.region_bytes or self._transports.preferred[0] != "shm":
            return None
        return RegionPool(
            self._meta.base, self._reader.client_id, self._transports.host, cfg.region_bytes, cfg.region_value_max,
            self._transports.clock,
        )  # fmt: skip

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Hand back the read leases of finished reads, release connections and mappings; every
        later call raises InvalidArgument."""
        if self._closed:
            return
        released = self._reader.take_released()
        if released:  # blocks this client read become removable at once
            try:
                self._meta.call(Release(released, self._reader.client_id))
            except KVStoreError:
                pass  # they run out on their own within the lease
        if self._region_pool is not None:
            self._region_pool.close()
        self._closed = True
        self._reader.close()
        self._writer.close()
        if self._probe is not None:
            self._probe.stop()
        self._transports.close()
        self._meta.close()

    @property
    def transports(self) -> tuple[str, ...]:
        """The data-plane transports this client uses, in preference order (those configured
        whose libraries are installed)."""
        return self._transports.preferred

    def transport(self, name: str) -> Transport:
        """This client's transport `name` (metered when metrics are on), made on first use: for
        diagnostics and tests that drive the data plane directly. TransportError once closed."""
        return self._transports.get(name)

    @property
    def meta(self) -> ShardedMetaClient:
        """The metadata client this KVClient calls (for calls it does not wrap; keyed calls go to
        their keys' shards)."""
        return self._meta

    def _check(self, keys: Sequence[str]) -> None:
        if self._closed:
            raise InvalidArgument("this KVClient is closed: make a new one")
        validate_keys(keys)

    # -- metadata calls ------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.exists_many([key])[0]

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        self._check(keys)
        return self._meta.call(Exists(keys))

    def match_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys are stored: the cached prefix of a chain of block keys."""
        self._check(keys)
        return self._meta.call(MatchPrefix(keys))

    def remove(self, key: str, force: bool = False) -> None:
        """Delete a key; KeyNotFound if absent, KeyBusy if being written, or being read (a read
        lease runs) unless `force`: then the key goes at once and its space once the lease ends."""
        err = self.remove_many([key], force)[0]
        if err is not None:
            raise err

    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[KVStoreError | None]:
        self._check(keys)
        self._reader.forget(keys)
        results = self._meta.call(Remove(keys, force, self._reader.take_released(), self._reader.client_id))
        return [r.error() for r in results]

    def stats(self) -> StoreStats:
        self._check([])
        return self._meta.call(Stats())

    def links(self) -> list[LinkStats]:
        """The link monitor's figures: per (this host -> daemon, transport), the EWMA bandwidth
        and latency of this client's real transfers (and probes). Empty without metrics."""
        return self.metrics.links.links() if self.metrics is not None else []

    # -- put -------------------------------------------------------------------------------------

    def put(self, key: str, value: Any) -> bool:
        """Store `value` (bytes-like, numpy array, or contiguous tensor on the CPU or a CUDA
        device) under `key`.

        Returns True if written, False if the key was already stored (its bytes are kept).
        """
        return self.put_many([key], [value])[0]

    def put_many(self, keys: Sequence[str], values: Sequence[Any], replica_num: int | None = None) -> list[bool]:
        """Store many values in one round of metadata calls. A key that could not be written is
        revoked (never left half-written) and the first error is raised after the others are
        committed; a key whose replicas were only partly written is committed with those."""
        self._check(keys)
        if len(keys) != len(values):
            raise InvalidArgument(f"{len(keys)} keys but {len(values)} values")
        if len(set(keys)) != len(keys):
            raise InvalidArgument("duplicate keys in one put_many")
        replicas = replica_num or self.config.replica_num
        views = plain_views(values, writable=False)
        if views is None and not any(self._staging.needs(v) for v in values):
            views = [byte_view(v, writable=False) for v in values]
        if views is not None:
            if not all(map(len, views)):
                raise InvalidArgument("empty values are not stored")
            return self._writer.put(keys, views, replicas)
        sizes = self._staging.sizes(values, writable=False)
        if not all(sizes):
            raise InvalidArgument("empty values are not stored")
        written: list[bool] = []
        first: KVStoreError | None = None
        for part in self._staging.chunks(values, sizes):
            views = self._staging.for_put(values[part.start : part.stop])
            try:
                written += self._writer.put(keys[part.start : part.stop], views, replicas)
            except KVStoreError as exc:  # as in one call: the other chunks still go, then it is raised
                first = first or exc
                written += [False] * len(part)
        if first is not None:
            raise first
        return written

    # -- pins ------------------------------------------------------------------------------------

    def pin(self, keys: Sequence[str], ttl_s: float) -> list[KVStoreError | None]:
        """Keep stored keys from eviction and tier moves for ttl_s (e.g. a shared system prompt).
        Per key: None, KeyNotFound, or NoSpace when the tier's pin cap is reached."""
        self._check(keys)
        return [r.error() for r in self._meta.call(Pin(keys, ttl_s))]

    def hold(self, keys: Sequence[str], holder: str) -> GetReply:
        """Look `keys` up under read leases held for `holder` (an id the caller picks) until
        release() or the reply's lease_ms: while held, a found key is neither evicted nor
        removed. Moves no bytes; each key's result says whether it was found (and its lease)."""
        self._check(keys)
        return self._meta.call(Get(list(keys), client_id=holder))

    def release(self, lease_ids: Sequence[int], holder: str) -> None:
        """End read leases that hold() took for `holder` (one already ended is ignored)."""
        if lease_ids:
            self._meta.call(Release(list(lease_ids), holder))

    def unpin(self, keys: Sequence[str]) -> list[KVStoreError | None]:
        self._check(keys)
        return [r.error() for r in self._meta.call(Unpin(keys))]

    # -- get -------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        return self.get_many([key])[0]

    def get_many(self, keys: Sequence[str]) -> list[bytes]:
        """The values of `keys`; raises KeyNotFound (or another error) for the first that fails."""
        self._check(keys)
        located = self._reader.locate(keys)
        values: list[bytes] = []
        views: list[memoryview] = []
        for loc in located:  # each value read straight into the bytes object returned: one copy
            value, view = new_bytes(loc.result.size)
            values.append(value)
            views.append(view)

        def resize(i: int, size: int) -> memoryview:
            values[i], view = new_bytes(size)
            return view

        self._reader.read(keys, located, views, strict=True, resize=resize)
        return values

    def get_into(self, key: str, buffer: Any) -> int:
        """Read `key` straight into `buffer` (writable bytes-like, numpy array, CPU or CUDA
        tensor); returns the number of bytes written at its start."""
        result: int = self.get_many_into([key], [buffer])[0]
        return result

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any], strict: bool = True) -> list[Any]:
        """Read each key into its buffer. strict: raise the first error; otherwise return, per key,
        the byte count or the KVStoreError (a miss is KeyNotFound) so callers can recompute."""
        self._check(keys)
        if len(keys) != len(buffers):
            raise InvalidArgument(f"{len(keys)} keys but {len(buffers)} buffers")
        views = plain_views(buffers, writable=True)
        if views is None and not any(self._staging.needs(b) for b in buffers):
            views = [byte_view(b, writable=True) for b in buffers]
        if views is not None:
            return self._reader.get(keys, views, strict)
        sizes = self._staging.sizes(buffers, writable=True)
        out: list[Any] = []
        try:
            for part in self._staging.chunks(buffers, sizes):
                chunk_keys = keys[part.start : part.stop]
                staged = self._staging.for_get(buffers[part.start : part.stop])
                results = self._reader.read(chunk_keys, self._reader.locate(chunk_keys), staged.views, strict=False)
                staged.land(results)
                out += results
        finally:
            self._staging.wait(buffers)  # no device copy may outlive the call, even a failed one
        if strict:
            first = next((r for r in out if isinstance(r, KVStoreError)), None)
            if first is not None:
                raise first
        return out

    # -- listing and describing (for operators) -------------------------------------------------

    def list_keys(self, prefix: str = "", limit: int = 0, cursor: str = "") -> KeyListing:
        """One page (`limit`, default 1000) of the stored keys starting with `prefix`, in byte
        order, after `cursor`; pass the page's `next_cursor` for the next ("" after the last)."""
        self._check([])
        return self._meta.call(ListKeys(prefix, limit, cursor))

    def iter_keys(self, prefix: str = "", page: int = 0) -> Iterator[str]:
        """Every stored key starting with `prefix`, page by page (keys stored meanwhile may or
        may not appear)."""
        cursor = ""
        while True:
            listing = self.list_keys(prefix, page, cursor)
            yield from listing.keys
            if not listing.next_cursor:
                return
            cursor = listing.next_cursor

    def describe(self, keys: Sequence[str]) -> list[KeyInfo]:
        """Per key: state (absent, pending, complete), size, replicas with their daemon and tier,
        and how much longer a read lease or a pin holds it. Takes no lease."""
        self._check(keys)
        return self._meta.call(Describe(keys))


def _client_metrics(config: ClientConfig, clock: Clock) -> ClientMetrics | None:
    if not config.metrics:
        return None
    from kvstore.metrics.client import ClientMetrics

    return ClientMetrics(clock)


def _start_probe(metrics: ClientMetrics | None, transports: Transports, config: ClientConfig) -> LinkProbe | None:
    if metrics is None or config.link_probe_s <= 0:
        return None
    from kvstore.metrics.client import tcp_probe_targets
    from kvstore.metrics.links import LinkProbe

    targets = tcp_probe_targets(metrics, lambda: transports.get("tcp"), config.replica_timeout_s)
    return LinkProbe(metrics.links, targets, config.link_probe_s).start()
