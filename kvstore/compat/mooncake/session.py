"""The batch calls of a set-up store, over kvstore's client SDK, answered as Mooncake's codes.

Every call takes Mooncake keys and caller memory already shaped as byte views (store.py does the
shaping) and returns one int per key: 0 or a byte count on success, a negative ErrorCode on
failure. kvstore errors become codes here and nowhere else (through codes.code_for); a miss is
OBJECT_NOT_FOUND, never an exception.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from kvstore.client import KeyBusy, KeyNotFound, KVClient, KVStoreError
from kvstore.compat.mooncake.codes import ErrorCode, code_for
from kvstore.compat.mooncake.local_buffer import LocalBuffer
from kvstore.compat.mooncake.memory import RegisteredMemory
from kvstore.compat.mooncake.namespace import KeyNamespace
from kvstore.compat.mooncake.replicate import ReplicateConfig, pin_ttl_s, refusal
from kvstore.compat.mooncake.segment_keys import SegmentKeys
from kvstore.compat.mooncake.segment_name import SegmentName
from kvstore.results import KeyState

log = logging.getLogger(__name__)
OK, NOT_FOUND, INVALID = int(ErrorCode.OK), int(ErrorCode.OBJECT_NOT_FOUND), int(ErrorCode.INVALID_PARAMS)
PAGE = 1000  # keys listed (and removed) per step of remove_all / remove_by_regex


class Session:
    """What `setup` builds and `close` ends: one KVClient, the key namespace, the store's name,
    its local buffer and the registered memory. No per-key state (keys are listed from the store
    when a call needs them), unless `segment_keys` is given: then the keys it writes, to remove
    at close. Thread safe (KVClient is)."""

    def __init__(
        self,
        client: KVClient,
        namespace: KeyNamespace,
        name: SegmentName,
        local_buffer: LocalBuffer,
        segment_keys: SegmentKeys | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.local_buffer = local_buffer
        self.segment_keys = segment_keys
        self.memory = RegisteredMemory()

    @property
    def hostname(self) -> str:
        return self.name.name

    def close(self) -> None:
        """Remove the segment's keys (when kept), then drop the connection and the name."""
        try:
            keys = self.segment_keys.take() if self.segment_keys is not None else []
            for at in range(0, len(keys), PAGE):
                self.client.remove_many(keys[at : at + PAGE], force=True)  # gone or removed: either way
        except KVStoreError as exc:
            log.warning("removing the closed store's keys: %s", exc)
        finally:
            self.client.close()
            self.name.release()

    # -- writes ----------------------------------------------------------------------------------

    def put(
        self,
        keys: Sequence[str],
        values: Sequence[memoryview | None],
        config: ReplicateConfig | None,
        bytes_api: bool = False,
    ) -> list[int]:
        """Store each value under its key; None (an unusable buffer) is INVALID_PARAMS. A key that
        is already stored, or being stored by another writer, keeps its bytes and answers 0, as
        Mooncake's Put does. Within one call the first of duplicate keys wins."""
        refused = refusal(config, bytes_api)
        if refused:
            return [refused] * len(keys)
        out = [INVALID] * len(keys)
        first: dict[str, int] = {}
        for i, (key, value) in enumerate(zip(keys, values)):
            if key in first or value is None or not self.namespace.storable(key):
                continue
            first[key] = i
        if not first:
            return self._copy_duplicates(keys, first, out)
        store_keys = [self.namespace.to_store(k) for k in first]
        views = [values[i] for i in first.values()]
        replica_num = config.replica_num if config is not None else None
        try:
            written = self.client.put_many(store_keys, views, replica_num=replica_num)
            for i in first.values():
                out[i] = OK
            if self.segment_keys is not None:
                self.segment_keys.add(k for k, w in zip(store_keys, written) if w)
        except KVStoreError as exc:
            self._after_failed_put(store_keys, list(first.values()), exc, out)
        self._pin(store_keys, [out[i] for i in first.values()], config)
        return self._copy_duplicates(keys, first, out)

    def _after_failed_put(self, store_keys: list[str], idxs: list[int], exc: KVStoreError, out: list[int]) -> None:
        """put_many raised its first error after committing the keys it could write: ask which
        are stored. The others all get the raised error's code (the SDK reports one error per
        call), except that a busy key, as in Mooncake, is being written by someone else: 0."""
        failed = 0 if isinstance(exc, KeyBusy) else code_for(exc)
        try:
            stored = self.client.exists_many(store_keys)
        except KVStoreError:
            stored = [False] * len(store_keys)
        for i, here in zip(idxs, stored):
            out[i] = OK if here else failed

    def _pin(self, store_keys: list[str], results: list[int], config: ReplicateConfig | None) -> None:
        ttl = pin_ttl_s(config)
        keys = [k for k, r in zip(store_keys, results) if r == OK]
        if ttl is None or not keys:
            return
        try:
            errors = self.client.unpin(keys) if ttl == 0.0 else self.client.pin(keys, ttl)
        except KVStoreError as exc:
            errors = [exc]
        for err in errors:
            if ttl == 0.0 and isinstance(err, KeyNotFound):
                continue  # DISABLE on a key that was not pinned: nothing to drop
            if err is not None:  # the put stands; the pin is best effort, as in Mooncake
                log.warning("pin after put: %s", err)
                break

    @staticmethod
    def _copy_duplicates(keys: Sequence[str], first: dict[str, int], out: list[int]) -> list[int]:
        for i, key in enumerate(keys):
            j = first.get(key)
            if j is not None and j != i:
                out[i] = out[j]
        return out

    def remove(self, keys: Sequence[str], force: bool) -> list[int]:
        """Per key: 0, OBJECT_NOT_FOUND, or OBJECT_HAS_LEASE while it is being read (unless force)."""
        out = [NOT_FOUND] * len(keys)
        idxs = [i for i, k in enumerate(keys) if self.namespace.storable(k)]
        store_keys = [self.namespace.to_store(keys[i]) for i in idxs]
        if not store_keys:
            return out
        try:
            errors = self.client.remove_many(store_keys, force=force)
        except KVStoreError as exc:
            for i in idxs:
                out[i] = code_for(exc, removing=True)
            return out
        for i, err in zip(idxs, errors):
            out[i] = OK if err is None else code_for(err, removing=True)
        self._forget([k for k, err in zip(store_keys, errors) if err is None])
        return out

    def _forget(self, store_keys: list[str]) -> None:
        if self.segment_keys is not None and store_keys:
            self.segment_keys.discard(store_keys)

    def remove_where(self, match: Callable[[str], bool], force: bool) -> int:
        """Remove every key of the namespace that the store holds and `match` (given the Mooncake
        key) takes, a listed page at a time; the number removed, or the code of a call that
        failed. Keys being read stay unless `force`."""
        namespace, removed, cursor = self.namespace, 0, ""
        try:
            while True:
                page = self.client.list_keys(namespace.prefix, PAGE, cursor)
                keys = [k for k in page.keys if namespace.owns(k) and match(namespace.from_store(k))]
                if keys:
                    gone = [k for k, err in zip(keys, self.client.remove_many(keys, force=force)) if err is None]
                    self._forget(gone)
                    removed += len(gone)
                if not page.next_cursor:
                    return removed
                cursor = page.next_cursor
        except KVStoreError as exc:
            return code_for(exc, removing=True)

    # -- reads -----------------------------------------------------------------------------------

    def exists(self, keys: Sequence[str]) -> list[int]:
        """Per key 1 or 0; a key kvstore cannot hold is 0; the call's error code if it fails."""
        out = [0] * len(keys)
        idxs = [i for i, k in enumerate(keys) if self.namespace.storable(k)]
        if not idxs:
            return out
        try:
            found = self.client.exists_many([self.namespace.to_store(keys[i]) for i in idxs])
        except KVStoreError as exc:
            return [code_for(exc)] * len(keys)
        for i, here in zip(idxs, found):
            out[i] = 1 if here else 0
        return out

    def size(self, key: str) -> int:
        """The value's size from the service's record (no value byte moves), OBJECT_NOT_FOUND, or
        REPLICA_IS_NOT_READY while it is being written."""
        if not self.namespace.storable(key):
            return NOT_FOUND
        try:
            [info] = self.client.describe([self.namespace.to_store(key)])
        except KVStoreError as exc:
            return code_for(exc)
        if info.state is KeyState.COMPLETE:
            return info.size
        return int(ErrorCode.REPLICA_IS_NOT_READY) if info.state is KeyState.PENDING else NOT_FOUND

    def get_into(self, keys: Sequence[str], views: Sequence[memoryview | None]) -> list[int]:
        """Read each key into its view; per key the byte count, or INVALID_PARAMS (no usable view,
        or one smaller than the value), OBJECT_NOT_FOUND, TRANSFER_FAIL, ..."""
        out = [INVALID] * len(keys)
        idxs = []
        for i, (key, view) in enumerate(zip(keys, views)):
            if not self.namespace.storable(key):
                out[i] = NOT_FOUND
            elif view is not None:
                idxs.append(i)
        if not idxs:
            return out
        try:
            got = self.client.get_many_into(
                [self.namespace.to_store(keys[i]) for i in idxs], [views[i] for i in idxs], strict=False
            )
        except KVStoreError as exc:
            got = [exc] * len(idxs)
        for i, result in zip(idxs, got):
            out[i] = code_for(result) if isinstance(result, BaseException) else int(result)
        return out

    def get(self, keys: Sequence[str]) -> list[bytes | int]:
        """Each key's bytes, or its error code. One batch; after a miss, key by key (the SDK's
        get_many raises its first failure)."""
        idxs = [i for i, k in enumerate(keys) if self.namespace.storable(k)]
        out: list[bytes | int] = [NOT_FOUND] * len(keys)
        store_keys = [self.namespace.to_store(keys[i]) for i in idxs]
        try:
            for i, value in zip(idxs, self.client.get_many(store_keys) if store_keys else []):
                out[i] = value
            return out
        except KVStoreError:
            pass
        for i, key in zip(idxs, store_keys):
            try:
                out[i] = self.client.get(key)
            except KVStoreError as exc:
                out[i] = code_for(exc)
        return out
