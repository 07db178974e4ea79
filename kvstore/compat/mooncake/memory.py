"""Caller memory named by raw addresses: the registry behind register_buffer and the *_from/_into calls.

Mooncake's zero-copy calls take integer pointers. Its own same-process path copies from whatever
address it is handed (a wrong one crashes the process); here every byte of a range a call names
must be registered, or the call answers INVALID_PARAMS and touches nothing. Memory is
viewed without a copy: each registered buffer is wrapped once (a ctypes array over its address)
and calls slice that view, so no per-call ctypes types pile up.

What this cannot check: that the caller still owns a buffer it registered. Unregister before
freeing, as Mooncake's contract also requires.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from typing import NamedTuple


class Region(NamedTuple):
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


class RegisteredMemory:
    """Thread safe. Registered regions never overlap (Mooncake refuses overlaps too)."""

    def __init__(self) -> None:
        self._bases: list[int] = []  # sorted
        self._sizes: dict[int, int] = {}
        self._views: dict[int, memoryview] = {}
        self._lock = threading.Lock()

    def register(self, base: int, size: int) -> bool:
        """Add [base, base+size); False (nothing changes) for a null or empty region, or one that
        overlaps a registered region."""
        if not _is_address(base) or not isinstance(size, int) or size <= 0:
            return False
        with self._lock:
            i = bisect.bisect_left(self._bases, base)
            if i < len(self._bases) and self._bases[i] < base + size:
                return False
            if i > 0 and self._bases[i - 1] + self._sizes[self._bases[i - 1]] > base:
                return False
            self._bases.insert(i, base)
            self._sizes[base] = size
            self._views[base] = _wrap(base, size)  # touches no memory: nothing is read here
            return True

    def unregister(self, base: int) -> bool:
        """Remove the region registered at exactly `base`; False if there is none."""
        with self._lock:
            if base not in self._sizes:
                return False
            del self._sizes[base], self._views[base]
            self._bases.remove(base)
            return True

    def regions(self) -> list[Region]:
        with self._lock:
            return [Region(b, self._sizes[b]) for b in self._bases]

    def covers(self, address: int, size: int) -> bool:
        """True if every byte of [address, address+size) is registered (size > 0): inside one
        region, or a run of regions registered back to back."""
        if not _is_address(address) or not isinstance(size, int) or size <= 0:
            return False
        end = address + size
        with self._lock:
            i = bisect.bisect_right(self._bases, address) - 1
            if i < 0:
                return False
            reached = self._bases[i] + self._sizes[self._bases[i]]
            while reached < end:
                i += 1
                if i == len(self._bases) or self._bases[i] != reached:
                    return False
                reached += self._sizes[self._bases[i]]
            return address < reached

    def view(self, address: int, size: int) -> memoryview | None:
        """A writable byte view of [address, address+size), or None unless `covers` holds."""
        if not self.covers(address, size):
            return None
        with self._lock:
            i = bisect.bisect_right(self._bases, address) - 1
            base = self._bases[i] if i >= 0 else 0
            whole = self._views.get(base)
        if whole is not None and address + size <= base + len(whole):
            return whole[address - base : address - base + size]
        return _wrap(address, size)  # a range over buffers registered back to back

    def view_within(self, buffer: int, offset: int, size: int) -> memoryview | None:
        """A writable byte view of `size` bytes at `offset` into the one registered region that
        holds address `buffer`, or None unless they lie inside it (from `buffer` to that region's
        end: Mooncake's capacity of a buffer; a region registered right after does not count)."""
        if not _is_address(buffer) or not isinstance(offset, int) or not isinstance(size, int):
            return None
        if offset < 0 or size <= 0:
            return None
        with self._lock:
            i = bisect.bisect_right(self._bases, buffer) - 1
            base = self._bases[i] if i >= 0 else 0
            whole = self._views.get(base)
        if whole is None or buffer + offset + size > base + len(whole):
            return None
        start = buffer - base + offset
        return whole[start : start + size]


def _wrap(address: int, size: int) -> memoryview:
    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")


def _is_address(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < (1 << 64)
