"""ARC eviction (Megiddo and Modha, FAST'03) over the store's COMPLETE keys: `--eviction arc`.

Two resident lists, each oldest first: `t1` holds keys stored and not read since, `t2` keys read
at least once since they were stored. Two ghost lists remember the keys lately evicted from each
(their hashes only, at most as many as are resident). A put of a key found in the `t1` ghost list (stored,
evicted unread, stored again) says the recency side was too short: its target share `p` grows; one
found in the `t2` ghost list shrinks it. Eviction takes the oldest of `t1` while `t1` holds more
than `p` keys, else the oldest of `t2`. On the Mooncake traces blocks stored once and never read
again (three quarters of the conversation trace's) leave before blocks that were reused, while a
conversation's next turn, coming back after its blocks left, teaches the policy to keep new
blocks longer (docs/traces.md has the study).

Every hook is O(1) (dict insertions, pops and moves); `victims` walks only what it takes, the
protected keys it passes, and at most SCOPE_SKIPS keys outside the scope asked for (a tier's
segments, a tenant) before it walks the scope's own recency instead.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from kvstore.meta.entry import Entry
from kvstore.meta.index import Scope

SCOPE_SKIPS = 256  # keys outside the scope one victims() call passes before it walks the scope's LRU


class ARCEviction:
    def __init__(self) -> None:
        self.t1: dict[str, None] = {}
        self.t2: dict[str, None] = {}
        # Ghosts by hash(key) (an int each, not the key's string), trimmed from the front: an
        # OrderedDict pops its oldest in O(1), where a dict walks past the slots deleted before.
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0  # target size of t1, in keys

    # -- the index's hooks (under the store's lock) ----------------------------------------------

    def added(self, key: str) -> None:
        """`key` became COMPLETE (a put ended, or a block was found on a daemon's disk)."""
        ghost = hash(key)
        if self.b1.pop(ghost, 0) is None:
            self.p = min(len(self.t1) + len(self.t2) + 1, self.p + max(1, len(self.b2) // max(1, len(self.b1))))
            self.t2[key] = None
        elif self.b2.pop(ghost, 0) is None:
            self.p = max(0, self.p - max(1, len(self.b1) // max(1, len(self.b2))))
            self.t2[key] = None
        else:
            self.t1[key] = None

    def used(self, key: str) -> None:
        """`key` was read (or touched by a reader of cached locations)."""
        if self.t1.pop(key, 0) is None or self.t2.pop(key, 0) is None:
            self.t2[key] = None  # the most recent of the reused

    def removed(self, key: str) -> None:
        """`key` left the index (evicted, removed, or its segment dropped): remembered as a ghost."""
        if self.t1.pop(key, 0) is None:
            self.b1[hash(key)] = None
        elif self.t2.pop(key, 0) is None:
            self.b2[hash(key)] = None
        resident = len(self.t1) + len(self.t2)
        while len(self.b1) + len(self.b2) > resident:
            (self.b1 if len(self.b1) > len(self.b2) else self.b2).popitem(last=False)

    # -- choosing ---------------------------------------------------------------------------------

    def victims(self, index: Scope, protected: Callable[[str], bool], bytes_needed: int) -> list[str]:
        chosen: list[str] = []
        freed = 0
        t1_left = len(self.t1)
        walks = iter(self.t1), iter(self.t2)
        skips = 0
        while freed < bytes_needed and skips < SCOPE_SKIPS:
            first = 0 if t1_left > self.p else 1
            key = next(walks[first], None)
            if key is None:
                key = next(walks[1 - first], None)
                if key is None:
                    return chosen
            elif first == 0:
                t1_left -= 1
            entry = index.entry(key)
            if entry is None:
                skips += 1
                continue
            if protected(key):
                continue
            chosen.append(key)
            freed += entry.size * len(entry.replicas())
        if freed < bytes_needed:  # a scope that is a small part of the keys: its own recency
            for key, entry in _least_recent_untaken(index, set(chosen)):
                if freed >= bytes_needed:
                    break
                if protected(key):
                    continue
                chosen.append(key)
                freed += entry.size * len(entry.replicas())
        return chosen

    def check(self, keys: Callable[[], Iterator[str]], count: int) -> None:
        """The resident lists hold exactly the index's COMPLETE keys; ghosts are not resident."""
        assert not (self.t1.keys() & self.t2.keys()), "a key is in both of ARC's lists"
        assert len(self.t1) + len(self.t2) == count, f"ARC holds {len(self.t1) + len(self.t2)} keys, the index {count}"
        assert all(k in self.t1 or k in self.t2 for k in keys()), "a COMPLETE key is in neither ARC list"
        assert not (self.b1.keys() & self.b2.keys()), "a ghost is in both ghost lists"
        assert len(self.b1) + len(self.b2) <= count, "more ghosts than resident keys"
        assert self.p >= 0, f"ARC's target {self.p} is negative"


def _least_recent_untaken(index: Scope, taken: set[str]) -> Iterator[tuple[str, Entry]]:
    return ((k, e) for k, e in index.least_recent() if k not in taken)
