"""Offset allocator for one segment: a free list with coalescing, searched by size class.

Free blocks are kept three ways: by start offset and by end offset (so a freed block merges with
both neighbours in O(1)) and in power-of-two size classes with a bitmask of non-empty classes (so
finding a block that fits is O(1): any block of a higher class is large enough).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class OffsetAllocator:
    def __init__(self, capacity: int, alignment: int = 64) -> None:
        if capacity <= 0 or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError("capacity must be positive and alignment a power of two")
        self.capacity = capacity - capacity % alignment
        self.alignment = alignment
        self.used = 0
        self._free_at: dict[int, int] = {}  # offset -> size
        self._free_end: dict[int, int] = {}  # offset + size -> offset
        self._classes: list[set[int]] = [set() for _ in range(65)]
        self._nonempty = 0  # bit k set <=> _classes[k] non-empty
        if self.capacity:
            self._insert(0, self.capacity)

    def aligned(self, size: int) -> int:
        return -(-size // self.alignment) * self.alignment

    @property
    def free_bytes(self) -> int:
        return self.capacity - self.used

    def allocate(self, size: int) -> int | None:
        """Reserve `size` bytes (rounded up to the alignment); the offset, or None if nothing fits."""
        need = self.aligned(max(size, 1))
        offset = self._find(need)
        if offset is None:
            return None
        block = self._remove(offset)
        if block > need:
            self._insert(offset + need, block - need)
        self.used += need
        return offset

    def reserve(self, offset: int, size: int) -> bool:
        """Mark [offset, offset+size) allocated if it is entirely free (used to re-announce blocks a
        daemon found on restart); False if any of it is taken."""
        need = self.aligned(max(size, 1))
        if offset % self.alignment or offset < 0 or offset + need > self.capacity:
            return False
        for start, length in self._free_at.items():
            if start <= offset and offset + need <= start + length:
                break
        else:
            return False
        self._remove(start)
        if offset > start:
            self._insert(start, offset - start)
        if start + length > offset + need:
            self._insert(offset + need, start + length - offset - need)
        self.used += need
        return True

    def reserve_all(self, ranges: Sequence[tuple[int, int]]) -> list[bool]:
        """reserve() each (offset, size) in turn, with the same answers (a range overlapping one
        reserved before it is refused), in O((n + f) log(n + f)) for n ranges and f free blocks
        where n reserve() calls cost O(n * f): how a service taking over restores a segment."""
        claims = sorted(
            (offset, need, i)
            for i, (offset, size) in enumerate(ranges)
            if offset % self.alignment == 0 and 0 <= offset <= self.capacity - (need := self.aligned(max(size, 1)))
        )
        # One sweep of the claims and the free blocks, both by offset, finds the block holding each.
        free = sorted(self._free_at.items())
        inside = []
        b = -1
        for offset, need, i in claims:
            while b + 1 < len(free) and free[b + 1][0] <= offset:
                b += 1
            if b >= 0 and offset + need <= free[b][0] + free[b][1]:
                inside.append(_Claim(offset, need, i, free[b][0]))
        taken = _first_come(inside)
        # Carve the taken ranges (disjoint, by offset) out of their blocks, a block at a time.
        block, cursor, end = -1, 0, 0
        for c in taken:
            if c.block != block:
                if cursor < end:
                    self._insert(cursor, end - cursor)
                block = cursor = c.block
                end = block + self._remove(block)
            if c.offset > cursor:
                self._insert(cursor, c.offset - cursor)
            cursor = c.offset + c.need
            self.used += c.need
        if cursor < end:
            self._insert(cursor, end - cursor)
        answers = [False] * len(ranges)
        for c in taken:
            answers[c.order] = True
        return answers

    def reserve_free_within(self, ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        """Mark allocated whatever is free inside the (offset, size) ranges, however they overlap
        each other or allocated space; returns the (offset, size) pieces taken. O((n + f) log f)
        for n ranges and f free blocks: how a service taking over keeps its predecessor's holds."""
        starts = sorted(self._free_at)
        spans = sorted((o, min(o + self.aligned(max(s, 1)), self.capacity)) for o, s in ranges if o >= 0)
        by_block: dict[int, list[tuple[int, int]]] = {}  # free block -> pieces of it taken, by offset
        cursor = 0  # the ranges before cover everything below it
        for lo, hi in spans:
            lo = max(lo, cursor)
            i = max(bisect.bisect_right(starts, lo) - 1, 0)
            while i < len(starts) and starts[i] < hi:
                block = starts[i]
                a, b = max(lo, block), min(hi, block + self._free_at[block])
                if a < b:
                    by_block.setdefault(block, []).append((a, b))
                i += 1
            cursor = max(cursor, hi)
        taken = []
        for block, pieces in by_block.items():
            at, end = block, block + self._remove(block)
            for a, b in pieces:
                if a > at:
                    self._insert(at, a - at)
                taken.append((a, b - a))
                self.used += b - a
                at = b
            if at < end:
                self._insert(at, end - at)
        return taken

    def free(self, offset: int, size: int) -> None:
        """Return a block given by allocate(size); merges with free neighbours."""
        size = self.aligned(max(size, 1))
        if offset in self._free_at or offset < 0 or offset + size > self.capacity:
            raise ValueError(f"free of [{offset}, +{size}) which is not allocated")
        self.used -= size
        left = self._free_end.get(offset)
        if left is not None:
            size += self._remove(left)
            offset = left
        if offset + size in self._free_at:
            size += self._remove(offset + size)
        self._insert(offset, size)

    def largest_free(self) -> int:
        if not self._nonempty:
            return 0
        top = self._classes[self._nonempty.bit_length() - 1]
        return max(self._free_at[o] for o in top)

    def _find(self, need: int) -> int | None:
        cls = need.bit_length()
        higher = self._nonempty >> (cls + 1)
        if higher:
            k = cls + 1 + ((higher & -higher).bit_length() - 1)
            return next(iter(self._classes[k]))
        for offset in self._classes[cls]:  # same class: sizes vary, check each
            if self._free_at[offset] >= need:
                return offset
        return None

    def _insert(self, offset: int, size: int) -> None:
        self._free_at[offset] = size
        self._free_end[offset + size] = offset
        k = size.bit_length()
        self._classes[k].add(offset)
        self._nonempty |= 1 << k

    def _remove(self, offset: int) -> int:
        size = self._free_at.pop(offset)
        del self._free_end[offset + size]
        k = size.bit_length()
        self._classes[k].discard(offset)
        if not self._classes[k]:
            self._nonempty &= ~(1 << k)
        return size

    def check_invariants(self, allocated: Iterable[tuple[int, int]] | None = None) -> None:
        """Free blocks are disjoint, coalesced and indexed consistently; with `allocated`
        (offset, size) pairs: they are disjoint from each other and the free blocks, and
        used + free == capacity."""
        free_total = 0
        prev_end = -1
        for offset in sorted(self._free_at):
            size = self._free_at[offset]
            assert size > 0 and offset % self.alignment == 0, (offset, size)
            assert offset > prev_end, f"free blocks overlap or touch at {offset}"
            assert self._free_end[offset + size] == offset
            assert offset in self._classes[size.bit_length()]
            prev_end = offset + size
            free_total += size
        assert len(self._free_end) == len(self._free_at)
        assert sum(len(c) for c in self._classes) == len(self._free_at)
        assert free_total + self.used == self.capacity, (free_total, self.used, self.capacity)
        if allocated is None:
            return
        spans = sorted(
            [(o, self.aligned(max(s, 1)), "used") for o, s in allocated]
            + [(o, s, "free") for o, s in self._free_at.items()]
        )
        end = 0
        for offset, size, kind in spans:
            assert offset >= end, f"{kind} block at {offset} overlaps the block before it"
            end = offset + size
        assert sum(s for _, s, k in spans if k == "used") == self.used, "used bytes disagree with blocks"


class _Claim(NamedTuple):
    """A range reserve_all() is asked for that lies in a free block: its place among the ranges
    asked (`order`) and the start of that block."""

    offset: int
    need: int
    order: int
    block: int


def _first_come(by_offset: list[_Claim]) -> list[_Claim]:
    """Of claims (by offset; each free on its own), those that taking them in order would take:
    one is refused if it overlaps one taken before it. The taken ones, by offset. A claim that
    overlaps no other is taken in one sweep; a cluster of k claims chained by overlaps is settled
    in O(k log k)."""
    taken: list[_Claim] = []
    cluster: list[_Claim] = []
    reach = 0  # end of the cluster so far
    for c in by_offset:
        if cluster and c.offset >= reach:
            taken.extend(_settle(cluster))
            cluster = []
        reach = max(reach, c.offset + c.need) if cluster else c.offset + c.need
        cluster.append(c)
    if cluster:
        taken.extend(_settle(cluster))
    return taken


def _settle(cluster: list[_Claim]) -> list[_Claim]:
    """The claims of a cluster (by offset) taken first come, first served, by offset.

    The claims taken are disjoint, so by offset their ends ascend too: a claim overlaps one taken
    iff it overlaps the nearest taken one on either side of it by offset."""
    if len(cluster) == 1:
        return cluster
    marks = _Marks(len(cluster))
    taken = [False] * len(cluster)
    for p in sorted(range(len(cluster)), key=lambda p: cluster[p].order):
        c = cluster[p]
        before = marks.count_before(p)
        if before:
            left = cluster[marks.kth(before)]
            if left.offset + left.need > c.offset:
                continue
        if before < marks.count and cluster[marks.kth(before + 1)].offset < c.offset + c.need:
            continue
        marks.mark(p)
        taken[p] = True
    return [c for p, c in enumerate(cluster) if taken[p]]


class _Marks:
    """Positions 0..n-1, some marked: counts of marked positions before one, and the k-th marked
    position, in O(log n) each (a Fenwick tree of counts)."""

    def __init__(self, n: int) -> None:
        self._tree = [0] * (n + 1)
        self._top = 1 << (n.bit_length() - 1)  # the highest power of two <= n
        self.count = 0

    def mark(self, p: int) -> None:
        self.count += 1
        i = p + 1
        while i < len(self._tree):
            self._tree[i] += 1
            i += i & -i

    def count_before(self, p: int) -> int:
        total, i = 0, p
        while i:
            total += self._tree[i]
            i -= i & -i
        return total

    def kth(self, k: int) -> int:
        """The position of the k-th marked one (1 <= k <= count)."""
        pos, step = 0, self._top
        while step:
            if pos + step < len(self._tree) and self._tree[pos + step] < k:
                pos += step
                k -= self._tree[pos]
            step >>= 1
        return pos
