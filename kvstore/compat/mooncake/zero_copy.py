"""The calls on registered memory: register_buffer, put_from / get_into and their batch and
multi-buffer forms, get_into_ranges. Mixed into MooncakeDistributedStore (store.py).

Every address range must lie inside one registered buffer (memory.py), else that key answers
INVALID_PARAMS: a bad pointer is an error code here, never a crash. Sizes and pointer lists that
do not line up are INVALID_PARAMS for every key of the call, as in Mooncake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.compat.mooncake import checks, ranges
from kvstore.compat.mooncake.buffers import contiguous, gather, scatter
from kvstore.compat.mooncake.codes import ErrorCode
from kvstore.compat.mooncake.replicate import ReplicateConfig

if TYPE_CHECKING:
    from kvstore.compat.mooncake.session import Session

INVALID = int(ErrorCode.INVALID_PARAMS)


class ZeroCopyCalls:
    _session: Session | None

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """0, or INVALID_PARAMS for a null or empty buffer, or one overlapping a registered one."""
        if self._session is None:
            return INVALID
        return 0 if self._session.memory.register(buffer_ptr, size) else INVALID

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """0, or INVALID_PARAMS if no buffer was registered at exactly this address."""
        if self._session is None:
            return INVALID
        return 0 if self._session.memory.unregister(buffer_ptr) else INVALID

    # -- single and batch ------------------------------------------------------------------------

    def put_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        return self.batch_put_from([key], [buffer_ptr], [size], config)[0]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        return self.batch_get_into([key], [buffer_ptr], [size])[0]

    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Per key 0 or a code. A size of 0 stores nothing and answers 0 (Mooncake's put of empty
        data)."""
        keys, ptrs, sizes = checks.keys(keys), checks.ints(buffer_ptrs, "buffer_ptrs"), checks.ints(sizes, "sizes")
        session = self._session
        if session is None or not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID] * len(keys)
        todo = [i for i in range(len(keys)) if sizes[i] != 0]
        out = [0] * len(keys)
        for i, code in zip(
            todo, session.put([keys[i] for i in todo], [session.memory.view(ptrs[i], sizes[i]) for i in todo], config)
        ):
            out[i] = code
        return out

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """Per key the bytes read, or INVALID_PARAMS (buffer unregistered or smaller than the
        value), OBJECT_NOT_FOUND, ..."""
        keys, ptrs, sizes = checks.keys(keys), checks.ints(buffer_ptrs, "buffer_ptrs"), checks.ints(sizes, "sizes")
        session = self._session
        if session is None or not (len(keys) == len(ptrs) == len(sizes)):
            return [INVALID] * len(keys)
        return session.get_into(keys, [session.memory.view(p, n) for p, n in zip(ptrs, sizes)])

    # -- one object over several buffers ---------------------------------------------------------

    def _parts(self, ptrs: list[int], sizes: list[int]) -> list[memoryview] | memoryview | None:
        """The buffers of one key: one view when they are a single registered run (no copy),
        else a view per part; None if any part is unregistered or empty."""
        session = self._session
        assert session is not None
        if not ptrs or len(ptrs) != len(sizes):
            return None
        if contiguous(ptrs, sizes) and session.memory.covers(ptrs[0], sum(sizes)):
            return session.memory.view(ptrs[0], sum(sizes))
        views = [session.memory.view(p, n) for p, n in zip(ptrs, sizes)]
        return None if any(v is None for v in views) else views  # type: ignore[return-value]

    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Each key's value is its buffers concatenated (one extra copy unless they are one run)."""
        keys = checks.keys(keys)
        all_ptrs = [checks.ints(p, "all_buffer_ptrs") for p in all_buffer_ptrs]
        all_n = [checks.ints(n, "all_sizes") for n in all_sizes]
        if self._session is None or not (len(keys) == len(all_ptrs) == len(all_n)):
            return [INVALID] * len(keys)
        values: list[memoryview | None] = []
        for ptrs, sizes in zip(all_ptrs, all_n):
            parts = self._parts(ptrs, sizes)
            values.append(None if parts is None else parts if isinstance(parts, memoryview) else gather(parts))
        return self._session.put(keys, values, config)

    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Each value fills its buffers in order; per key the bytes read. Buffers smaller than the
        value together are INVALID_PARAMS. (Mooncake also fails buffers larger than the value,
        with TRANSFER_FAIL; here they are filled from the start.)"""
        keys = checks.keys(keys)
        all_ptrs = [checks.ints(p, "all_buffer_ptrs") for p in all_buffer_ptrs]
        all_n = [checks.ints(n, "all_sizes") for n in all_sizes]
        session = self._session
        if session is None or not (len(keys) == len(all_ptrs) == len(all_n)):
            return [INVALID] * len(keys)
        parts = [self._parts(p, n) for p, n in zip(all_ptrs, all_n)]
        # Scattered parts are read whole into a staging buffer, then copied out.
        views = [
            p if p is None or isinstance(p, memoryview) else memoryview(bytearray(sum(len(v) for v in p)))
            for p in parts
        ]
        out = session.get_into(keys, views)
        for n, p, staged in zip(out, parts, views):
            if n > 0 and isinstance(p, list) and staged is not None:
                scatter(staged[:n], p)
        return out

    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Fragments of objects into registered buffers (see ranges.py)."""
        return ranges.get_into_ranges(
            self._session,
            checks.ints(buffer_ptrs, "buffer_ptrs"),
            all_keys,
            all_dst_offsets,
            all_src_offsets,
            all_sizes,
        )
