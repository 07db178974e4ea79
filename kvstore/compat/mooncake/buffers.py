"""Byte shapes the Mooncake API hands back or takes apart: BufferHandle, and one object spread
over several caller buffers (the *_multi_buffers calls)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence


class BufferHandle(bytearray):
    """What get_buffer returns: the value's bytes (the buffer protocol, len()) with Mooncake's
    `ptr()` and `size()`. It owns its memory; Mooncake's points into its local buffer instead."""

    def ptr(self) -> int:
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self)) if len(self) else 0

    def size(self) -> int:
        return len(self)


def contiguous(ptrs: Sequence[int], sizes: Sequence[int]) -> bool:
    """Whether the parts are one run of memory, each starting where the previous one ends."""
    return all(ptrs[i] + sizes[i] == ptrs[i + 1] for i in range(len(ptrs) - 1))


def gather(parts: Sequence[memoryview]) -> memoryview:
    """The parts, in order, as one byte view: the first part itself when there is only one,
    else one copy into a new buffer."""
    if len(parts) == 1:
        return parts[0]
    out = bytearray(sum(len(p) for p in parts))
    at = 0
    for part in parts:
        out[at : at + len(part)] = part
        at += len(part)
    return memoryview(out)


def scatter(data: memoryview, parts: Sequence[memoryview]) -> None:
    """Copy `data` into the parts in order, filling each before the next (the last may be left
    partly unwritten when `data` is shorter than the parts together)."""
    at = 0
    for part in parts:
        n = min(len(part), len(data) - at)
        if n <= 0:
            return
        part[:n] = data[at : at + n]
        at += n
