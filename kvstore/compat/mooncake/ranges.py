"""get_into_ranges: byte ranges of objects gathered into registered buffers, buffer-major.

results[i][j][k] is fragment k of key j into buffer i: its size, or INVALID_PARAMS (a shape that
does not line up, a destination past the end of the registered buffer that holds it (a buffer
registered right after it does not extend it, as in Mooncake), a source range past the object's
end), or the key's read error (OBJECT_NOT_FOUND, ...). kvstore reads whole values, so each key is
read once per call, into a staging buffer, and its fragments are copied from there. Registered
memory: the local buffer plays no part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvstore.compat.mooncake.codes import ErrorCode

if TYPE_CHECKING:
    from kvstore.compat.mooncake.session import Session

INVALID = int(ErrorCode.INVALID_PARAMS)


def get_into_ranges(
    session: Session | None,
    ptrs: list[int],
    all_keys: Sequence[Sequence[str]],
    all_dst: Sequence[Sequence[Sequence[int]]],
    all_src: Sequence[Sequence[Sequence[int]]],
    all_sizes: Sequence[Sequence[Sequence[int]]],
) -> list[list[list[int]]]:
    out = [
        [[INVALID] * len(all_dst[i][j]) if i < len(all_dst) and j < len(all_dst[i]) else [] for j in range(len(keys))]
        for i, keys in enumerate(all_keys)
    ]
    if session is None or not (len(ptrs) == len(all_keys) == len(all_dst) == len(all_src) == len(all_sizes)):
        return out
    wanted = sorted({k for keys in all_keys for k in keys})
    values = dict(zip(wanted, session.get(wanted))) if wanted else {}
    for i, ptr in enumerate(ptrs):
        for j, key in enumerate(all_keys[i]):
            if j >= len(all_dst[i]) or j >= len(all_src[i]) or j >= len(all_sizes[i]):
                continue
            dst, src, sizes = all_dst[i][j], all_src[i][j], all_sizes[i][j]
            if not (len(dst) == len(src) == len(sizes)):
                continue
            value = values[key]
            for k, (d, s, n) in enumerate(zip(dst, src, sizes)):
                if isinstance(value, int):
                    out[i][j][k] = value
                    continue
                view = session.memory.view_within(ptr, d, n)
                if view is None or s < 0 or s + n > len(value):
                    continue
                view[:] = value[s : s + n]
                out[i][j][k] = n
    return out
