"""kvstore as an L2 adapter of LMCache's multi-process server (`lmcache server`): a plug-in its
own loader imports, so several LMCache servers, on several hosts, share one kvstore pool.

    lmcache server ... --l2-adapter '{"type": "plugin",
        "module_path": "kvstore.compat.lmcache.l2_adapter", "class_name": "KVStoreL2Adapter",
        "adapter_params": {"meta": "HOST:PORT"}}'

LMCache finds KVStoreL2AdapterConfig beside the class by its name and builds it from
`adapter_params` (l2_settings.py). Each chunk is one kvstore value, its memory object's bytes, under
the key l2_keys.py gives. Store, lookup-and-lock and load are tasks on a worker pool, signalled on
three event fds (l2_tasks.py); a lock is a kvstore read lease, an unlock hands it back
(l2_leases.py); a request's cache_salt picks the tenant (l2_tenants.py).

Failures are per key where LMCache's interface has room for it: a lookup or a load reports each
key in its bitmap (a kvstore error is a miss, LMCache recomputes); a store task fails whole when
any of its keys could not be written (the others are written), and names those keys in the log.
"""

from __future__ import annotations

import logging
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from lmcache.lmcache_native import Bitmap
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier

from kvstore.client import KVStoreError
from kvstore.clock import Clock, SystemClock
from kvstore.compat.lmcache import l2_settings
from kvstore.compat.lmcache.l2_keys import batches
from kvstore.compat.lmcache.l2_leases import Lease, LeaseBook, Releaser
from kvstore.compat.lmcache.l2_settings import L2Settings
from kvstore.compat.lmcache.l2_tasks import TaskBoard, TaskIds
from kvstore.compat.lmcache.l2_tenants import TenantClients
from kvstore.config import ClientConfig, load_config
from kvstore.errors import ErrorCode, InvalidArgument, TransportError, Unavailable

if TYPE_CHECKING:
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.memory_management import MemoryObj

log = logging.getLogger(__name__)


class KVStoreL2AdapterConfig(L2AdapterConfigBase):
    """LMCache's config object for the plug-in: the parsed adapter_params."""

    def __init__(self, settings: L2Settings) -> None:
        self.settings = settings

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KVStoreL2AdapterConfig:
        try:
            return cls(l2_settings.parse(d))
        except InvalidArgument as exc:  # what LMCache's config classes raise
            raise ValueError(str(exc)) from exc

    @classmethod
    def help(cls) -> str:
        return (
            "kvstore L2 adapter (adapter_params):\n"
            "- meta (str): the kvstore metadata service, HOST:PORT (default $KVSTORE_LMCACHE_META)\n"
            "- key_prefix (str): before each chunk's key (default 'lmcache/')\n"
            "- num_workers (int): threads for store, lookup and load tasks (default 4)\n"
            "- salt_token_env (dict): cache_salt -> environment variable holding a kvstore tenant token"
        )


class KVStoreL2Adapter(L2AdapterInterface):
    def __init__(
        self,
        config: KVStoreL2AdapterConfig | dict[str, Any],
        l1_memory_desc: Any = None,
        client_config: ClientConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(max_capacity_bytes=0)  # kvstore evicts by its own policy
        cfg = config.settings if isinstance(config, KVStoreL2AdapterConfig) else l2_settings.parse(config)
        self.settings = cfg
        self._clock = clock or SystemClock()
        self._clients = TenantClients(cfg, client_config or load_config(ClientConfig))
        self._pool = ThreadPoolExecutor(cfg.num_workers, thread_name_prefix="kvstore-l2")
        ids = TaskIds()
        self._stores: TaskBoard[L2StoreResult] = TaskBoard("store", create_event_notifier(), self._pool, ids)
        self._lookups: TaskBoard[Bitmap] = TaskBoard("lookup", create_event_notifier(), self._pool, ids)
        self._loads: TaskBoard[Bitmap] = TaskBoard("load", create_event_notifier(), self._pool, ids)
        self._leases = LeaseBook()
        self._releaser = Releaser(secrets.token_hex(8), self._clock)
        self._status_lock = threading.Lock()
        self._failed_keys = 0
        self._reachable = True  # the last call reached the service
        log.info("kvstore L2 adapter: metadata service %s, keys under %r", cfg.meta, cfg.key_prefix)

    # -- event fds -------------------------------------------------------------------------------

    def get_store_event_fd(self) -> int:
        return self._stores.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookups.fileno()

    def get_load_event_fd(self) -> int:
        return self._loads.fileno()

    # -- store -----------------------------------------------------------------------------------

    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> int:
        return self._stores.submit(lambda: self._store(keys, objects), lambda _: L2StoreResult(False, 0))

    def pop_completed_store_tasks(self) -> dict[int, L2StoreResult]:
        return self._stores.pop_all()

    def _store(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2StoreResult:
        """Write every chunk (one already stored keeps its bytes: equal keys, equal KV). Fails
        whole if any key could not be written; the bytes counted are those newly written."""
        ok, written_bytes = True, 0
        stored: list[ObjectKey] = []
        sizes: list[int] = []
        for batch in batches(self.settings.key_prefix, keys):
            views = [objects[i].byte_array for i in batch.places]
            try:
                written = self._clients.for_salt(batch.cache_salt).put_many(batch.keys, views)
                self._note()
            except KVStoreError as exc:  # the chunks that could be written are
                ok = False
                failed = self._unstored(batch.cache_salt, batch.keys)
                self._note(exc, len(failed))
                log.warning("kvstore L2 store: %d chunks not stored (%s): %s", len(failed), exc, failed[:4])
                continue
            for i, new, view in zip(batch.places, written, views, strict=True):
                if new:
                    stored.append(keys[i])
                    sizes.append(len(view))
                    written_bytes += len(view)
        if stored:
            self._notify_keys_stored(stored, sizes)
        return L2StoreResult(ok, written_bytes)

    def _unstored(self, cache_salt: str, keys: list[str]) -> list[str]:
        """Which of a failed put's keys are not stored (all, if that cannot be asked)."""
        try:
            there = self._clients.for_salt(cache_salt).exists_many(keys)
        except KVStoreError:
            return list(keys)
        return [key for key, stored in zip(keys, there, strict=True) if not stored]

    # -- lookup and lock -------------------------------------------------------------------------

    def submit_lookup_and_lock_task(
        self, keys: list[ObjectKey], group_layout_descs: dict[int, MemoryLayoutDesc] | None = None
    ) -> int:
        return self._lookups.submit(lambda: self._lookup_and_lock(keys), lambda _: Bitmap(len(keys)))

    def query_lookup_and_lock_result(self, task_id: int) -> Bitmap | None:
        return self._lookups.pop(task_id)

    def _lookup_and_lock(self, keys: list[ObjectKey]) -> Bitmap:
        """One Get per tenant under this adapter's holder id: a found key is set in the bitmap and
        its read lease kept for the unlock."""
        found = Bitmap(len(keys))
        for batch in batches(self.settings.key_prefix, keys):
            try:
                client = self._clients.for_salt(batch.cache_salt)
                reply = client.hold(batch.keys, self._releaser.holder)
                self._note()
            except KVStoreError as exc:
                self._note(exc)
                log.warning("kvstore L2 lookup of %d chunks failed (a miss): %s", len(batch.keys), exc)
                continue
            expires = self._clock.monotonic() + reply.lease_ms / 1000
            for i, result in zip(batch.places, reply.results, strict=True):
                if result.code is not ErrorCode.OK:
                    continue
                found.set(i)
                if result.lease_id:
                    self._leases.add(keys[i], Lease(client, result.lease_id, expires))
        return found

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        """Hand back one read lease per key, in the background; never fails (l2_leases.py)."""
        self._releaser.submit(self._leases.take(keys))

    # -- load ------------------------------------------------------------------------------------

    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> int:
        return self._loads.submit(lambda: self._load(keys, objects), lambda _: Bitmap(len(keys)))

    def query_load_result(self, task_id: int) -> Bitmap | None:
        return self._loads.pop(task_id)

    def _load(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> Bitmap:
        """Read each chunk straight into its memory object; a key is loaded when the value fills
        the object exactly (a miss, an error or another size is not)."""
        loaded = Bitmap(len(keys))
        accessed: list[ObjectKey] = []
        for batch in batches(self.settings.key_prefix, keys):
            views = [objects[i].byte_array for i in batch.places]
            try:
                client = self._clients.for_salt(batch.cache_salt)
                results = client.get_many_into(batch.keys, views, strict=False)
                self._note()
            except KVStoreError as exc:
                self._note(exc)
                results = [exc] * len(batch.keys)
            for i, key, n, view in zip(batch.places, batch.keys, results, views, strict=True):
                if isinstance(n, int) and n == len(view):
                    loaded.set(i)
                    accessed.append(keys[i])
                elif not isinstance(n, KVStoreError) or n.code is not ErrorCode.KEY_NOT_FOUND:
                    self._note(failed_keys=1)
                    log.warning("kvstore L2 load of %s failed: %s (into %d bytes)", key, n, len(view))
        if accessed:
            self._notify_keys_accessed(accessed)
        return loaded

    # -- eviction, status, close -----------------------------------------------------------------

    def delete(self, keys: list[ObjectKey]) -> None:
        """Remove chunks LMCache's own L2 eviction picked (a chunk being read stays)."""
        gone: list[ObjectKey] = []
        sizes: list[int] = []
        for batch in batches(self.settings.key_prefix, keys):
            try:
                client = self._clients.for_salt(batch.cache_salt)
                infos = client.describe(batch.keys)
                errors = client.remove_many(batch.keys)
            except KVStoreError as exc:
                log.warning("kvstore L2 delete of %d chunks failed: %s", len(batch.keys), exc)
                continue
            for i, info, err in zip(batch.places, infos, errors, strict=True):
                if err is None:
                    gone.append(keys[i])
                    sizes.append(info.size)
        if gone:
            self._notify_keys_deleted(gone, sizes)

    def _note(self, exc: KVStoreError | None = None, failed_keys: int = 0) -> None:
        """Count keys that failed other than by a miss; whether the service could be reached."""
        with self._status_lock:
            self._failed_keys += failed_keys
            if failed_keys == 0 or exc is not None:
                self._reachable = not isinstance(exc, Unavailable | TransportError)

    def report_status(self) -> dict[str, Any]:
        released = self._releaser.stats()
        with self._status_lock:
            failed, reachable = self._failed_keys, self._reachable
        return {
            "is_healthy": reachable,
            "type": "KVStoreL2Adapter",
            "meta": self.settings.meta,
            "failed_keys": failed,
            "leases_held": self._leases.held(),
            "leases_released": released.released,
            "leases_expired": released.expired,
            "leases_pending_release": released.pending,
            "tasks_running": sum(b.running() for b in (self._stores, self._lookups, self._loads)),
        }

    def close(self) -> None:
        """Finish the running tasks, hand back the leases still held, close clients and fds."""
        self._pool.shutdown(wait=True)
        self._releaser.submit(self._leases.take_all())
        self._releaser.close()
        self._clients.close()
        for board in (self._stores, self._lookups, self._loads):
            board.close()
