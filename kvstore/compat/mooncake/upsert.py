"""The upsert calls (insert, or replace a stored value), mixed into MooncakeDistributedStore.

kvstore keeps the first value of a key (keys are content addressed), so an upsert removes the key
(forced: a reader already under way still gets the old bytes) and puts the new value. Not atomic
as Mooncake's is: between the two steps a reader of the key misses. An upsert Mooncake refuses
(its config, or values that do not fit the local buffer) removes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvstore.compat.mooncake import checks
from kvstore.compat.mooncake.buffers import gather
from kvstore.compat.mooncake.codes import ErrorCode
from kvstore.compat.mooncake.replicate import ReplicateConfig, refusal

if TYPE_CHECKING:
    from kvstore.compat.mooncake.session import Session

INVALID = int(ErrorCode.INVALID_PARAMS)


class UpsertCalls:
    _session: Session | None

    def _upsert(
        self, keys: list[str], views: list[memoryview | None], config: ReplicateConfig | None, bytes_api: bool
    ) -> list[int]:
        session = self._session
        assert session is not None
        refused = refusal(config, bytes_api)
        if refused:
            return [refused] * len(keys)
        if bytes_api and not session.local_buffer.holds(sum(len(v) for v in views if v is not None)):
            return [INVALID] * len(keys)
        todo = [i for i, v in enumerate(views) if v is not None]
        session.remove([keys[i] for i in todo], force=True)
        return session.put(keys, views, config, bytes_api=bytes_api)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        view, config = checks.byte_view(value), checks.config(config)
        checks.key(key)
        if self._session is None:
            return INVALID
        return self._upsert([key], [view if len(view) else None], config, True)[0]

    def upsert_batch(self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None) -> int:
        keys, config = checks.keys(keys), checks.config(config)
        views = [checks.byte_view(v) for v in values]
        if self._session is None or len(keys) != len(views):
            return INVALID
        results = self._upsert(keys, [v if len(v) else None for v in views], config, True) if keys else []
        return next((r for r in results if r != 0), 0)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        views = [checks.byte_view(p) for p in parts]
        checks.key(key)
        config = checks.config(config)
        if self._session is None:
            return INVALID
        value = gather(views) if views else memoryview(b"")
        return self._upsert([key], [value], config, True)[0] if len(value) else 0

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self.batch_upsert_from([key], [buffer_ptr], [size], config)[0]

    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        keys, config = checks.keys(keys), checks.config(config)
        ptrs, sizes = checks.ints(buffer_ptrs, "buffer_ptrs"), checks.ints(sizes, "sizes")
        session = self._session
        if session is None or not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID] * len(keys)
        todo = [i for i in range(len(keys)) if sizes[i] != 0]
        out = [0] * len(keys)
        results = self._upsert(
            [keys[i] for i in todo], [session.memory.view(ptrs[i], sizes[i]) for i in todo], config, False
        )
        for i, code in zip(todo, results):
            out[i] = code
        return out
