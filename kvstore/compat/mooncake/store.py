"""`MooncakeDistributedStore` over kvstore: Mooncake Store's Python class, call for call.

Same method names, arguments, defaults and return conventions as Mooncake's binding
(mooncake-integration/store/store_py.cpp): ints are 0 / a byte count / a count on success and a
negative Mooncake ErrorCode on failure; `get` answers b"" for a miss; `is_exist` 1, 0 or a
negative code. Calls on a store that is not set up (or is closed) answer INVALID_PARAMS, where
Mooncake's own binding dereferences a null client. This file holds set-up, the bytes API and
key management; zero_copy.py the calls on registered memory, upsert.py the replacing puts,
unsupported.py the rest. The bytes API stages values through the local buffer (local_buffer.py).
docs/compat-mooncake.md is the table of every method and how it differs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kvstore.client import KVClient, KVStoreError
from kvstore.compat.mooncake import checks, setup_args
from kvstore.compat.mooncake.buffers import BufferHandle, gather
from kvstore.compat.mooncake.codes import ErrorCode, code_for
from kvstore.compat.mooncake.local_buffer import LocalBuffer
from kvstore.compat.mooncake.namespace import KeyNamespace
from kvstore.compat.mooncake.replicate import ReplicateConfig
from kvstore.compat.mooncake.segment_keys import SegmentKeys
from kvstore.compat.mooncake.segment_name import SegmentName
from kvstore.compat.mooncake.session import Session
from kvstore.compat.mooncake.settings import client_config, compat_settings, keeps_segment_keys, meta_address
from kvstore.compat.mooncake.unsupported import UnsupportedCalls
from kvstore.compat.mooncake.upsert import UpsertCalls
from kvstore.compat.mooncake.zero_copy import ZeroCopyCalls

INVALID = int(ErrorCode.INVALID_PARAMS)


class MooncakeDistributedStore(ZeroCopyCalls, UpsertCalls, UnsupportedCalls):
    def __init__(self) -> None:
        self._session: Session | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """Connect to the kvstore metadata service named as the master. Both of Mooncake's forms:
        setup(local_hostname, metadata_server, global_segment_size, local_buffer_size, protocol,
        rdma_devices, master_server_addr, engine=None, ...) and setup(config_dict). 0, or
        INVALID_PARAMS / RPC_FAIL (the service does not answer). A store already set up is
        closed and set up again."""
        parsed = setup_args.from_call(self, args, kwargs)
        if isinstance(parsed, int):
            return parsed
        self.close()
        settings = compat_settings()
        try:
            client = KVClient(meta_address(parsed.master_server_addr, settings), client_config(parsed))
        except KVStoreError as exc:
            return code_for(exc)
        try:
            client.exists_many(["mooncake-compat/setup-probe"])  # the service answers
            name = SegmentName(parsed.local_hostname)
        except (KVStoreError, OSError) as exc:
            client.close()
            return code_for(exc) if isinstance(exc, KVStoreError) else int(ErrorCode.INTERNAL_ERROR)
        self._session = Session(
            client,
            KeyNamespace(parsed.tenant_id),
            name,
            LocalBuffer(parsed.local_buffer_size),
            SegmentKeys() if keeps_segment_keys(parsed, settings) else None,
        )
        return 0

    def close(self) -> int:
        """Drop the connection; registered buffers are forgotten; with
        KVSTORE_MOONCAKE_DROP_ON_CLOSE, a store with a segment first removes the keys it wrote.
        0, also when not set up."""
        session, self._session = self._session, None
        if session is not None:
            session.close()
        return 0

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 the metadata service does not answer."""
        if self._session is None:
            return 1
        try:
            self._session.client.exists_many(["mooncake-compat/health-probe"])
        except KVStoreError:
            return 2
        return 0

    def get_hostname(self) -> str:
        """`local_hostname` as given to setup when it has a port, else `local_hostname:PORT`
        (segment_name.py); "" when not set up."""
        return self._session.hostname if self._session is not None else ""

    # -- bytes API -------------------------------------------------------------------------------

    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        view, config = checks.byte_view(value), checks.config(config)
        checks.key(key)
        if self._session is None or not self._session.local_buffer.holds(len(view)):
            return INVALID
        return self._session.put([key], [view if len(view) else None], config, bytes_api=True)[0]

    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None) -> int:
        """One code for the batch: 0, or the first key's failure (INVALID_PARAMS when the lists
        differ in length, or the values together do not fit the local buffer). Keys already
        stored keep their bytes."""
        keys, config = checks.keys(keys), checks.config(config)
        views = [checks.byte_view(v) for v in values]
        if self._session is None or len(keys) != len(views):
            return INVALID
        if not self._session.local_buffer.holds(sum(len(v) for v in views)):
            return INVALID
        if not keys:
            return 0
        results = self._session.put(keys, [v if len(v) else None for v in views], config, bytes_api=True)
        return next((r for r in results if r != 0), 0)

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """The parts, concatenated, as one value. An empty total stores nothing and answers 0."""
        views = [checks.byte_view(p) for p in parts]
        checks.key(key)
        config = checks.config(config)
        if self._session is None:
            return INVALID
        value = gather(views) if views else memoryview(b"")
        if not len(value):
            return 0
        if not self._session.local_buffer.holds(len(value)):
            return INVALID
        return self._session.put([key], [value], config, bytes_api=True)[0]

    def get(self, key: str) -> bytes:
        """The value, or b"" for a miss or any failure."""
        checks.key(key)
        if self._session is None:
            return b""
        value = self._staged_get([key])[0]
        return value if isinstance(value, bytes) else b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        keys = checks.keys(keys)
        if self._session is None:
            return [b""] * len(keys)
        return [v if isinstance(v, bytes) else b"" for v in self._staged_get(keys)] if keys else []

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value as a BufferHandle, or None for a miss."""
        checks.key(key)
        return self.batch_get_buffer([key])[0]

    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        keys = checks.keys(keys)
        if self._session is None or not keys:
            return [None] * len(keys)
        return [BufferHandle(v) if isinstance(v, bytes) else None for v in self._staged_get(keys)]

    def _staged_get(self, keys: list[str]) -> list[bytes | int]:
        """Session.get, where a value that finds no room left in the local buffer is
        INVALID_PARAMS (the callers answer it as a miss)."""
        assert self._session is not None
        values = self._session.get(keys)
        room = self._session.local_buffer.admit([len(v) if isinstance(v, bytes) else None for v in values])
        return [v if fits or not isinstance(v, bytes) else INVALID for v, fits in zip(values, room)]

    def get_size(self, key: str) -> int:
        """The value's size in bytes, or OBJECT_NOT_FOUND (...), from the service's record: no
        value byte is read."""
        checks.key(key)
        if self._session is None:
            return INVALID
        return self._session.size(key)

    # -- keys ------------------------------------------------------------------------------------

    def is_exist(self, key: str) -> int:
        checks.key(key)
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        keys = checks.keys(keys)
        if self._session is None:
            return [INVALID] * len(keys)
        return self._session.exists(keys)

    def remove(self, key: str, force: bool = False) -> int:
        checks.key(key)
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        keys = checks.keys(keys)
        if self._session is None:
            return [INVALID] * len(keys)
        return self._session.remove(keys, bool(force))

    def remove_all(self, force: bool = False) -> int:
        """Remove every key of this store's namespace (tenant_id) that the store holds, whoever
        wrote it, as Mooncake removes every key of its cluster; the number removed. Keys being
        read stay unless `force`."""
        if self._session is None:
            return INVALID
        return self._session.remove_where(lambda key: True, bool(force))

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """As remove_all, over the keys the pattern finds (re.search, as Mooncake's
        std::regex_search); the number removed, INVALID_PARAMS for a bad pattern."""
        if self._session is None:
            return INVALID
        try:
            pattern = re.compile(regex_pattern)
        except (re.error, TypeError):
            return INVALID
        return self._session.remove_where(lambda key: pattern.search(key) is not None, bool(force))
