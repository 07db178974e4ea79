"""Belady's offline policy on a trace: at each eviction, drop the held block (or the one being
stored: it may bypass the cache) whose next use is farthest in the future. It knows the future,
so no online policy is held to it; it is the reference the issue measures LRU against (the
prefix structure makes it not exactly optimal, but nearly: a block is used only with its head).

A max-heap of (next use, block) with stale entries skipped: O(log n) a block.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from kvstore.bench.trace.format import Request
from kvstore.bench.trace.sim import SimResult

NEVER = 1 << 62


def next_uses(requests: Sequence[Request]) -> list[list[int]]:
    """Per request and block: the index of the next request holding that block (NEVER if none)."""
    later: dict[int, int] = {}
    out: list[list[int]] = [[] for _ in requests]
    for i in range(len(requests) - 1, -1, -1):
        ids = requests[i].hash_ids
        out[i] = [later.get(h, NEVER) for h in ids]
        for h in ids:
            later[h] = i
    return out


def belady(requests: Sequence[Request], capacity: int) -> SimResult:
    """Replay `requests` (match, load, store the rest, as sim.step) with Belady's evictions."""
    uses = next_uses(requests)
    held: dict[int, int] = {}  # block -> its next use
    heap: list[tuple[int, int]] = []  # (-next use, block), stale where held[block] differs
    hits: list[int] = []
    evictions = 0
    for request, nxt in zip(requests, uses, strict=True):
        ids = request.hash_ids
        hit = 0
        while hit < len(ids) and ids[hit] in held:
            hit += 1
        hits.append(request.tokens_in(hit))
        for pos, block in enumerate(ids):
            if block in held:
                held[block] = nxt[pos]
                heapq.heappush(heap, (-nxt[pos], block))
                continue
            if len(held) >= capacity:
                while True:
                    far, victim = heap[0]
                    if held.get(victim) == -far:
                        break
                    heapq.heappop(heap)
                if -far <= nxt[pos]:
                    continue  # the new block is needed last: not stored
                heapq.heappop(heap)
                del held[victim]
                evictions += 1
            held[block] = nxt[pos]
            heapq.heappush(heap, (-nxt[pos], block))
        if len(heap) > 4 * capacity + 64:  # drop the stale entries now and then
            heap = [(-t, b) for b, t in held.items()]
            heapq.heapify(heap)
    return SimResult(tuple(hits), evictions, len(held))
