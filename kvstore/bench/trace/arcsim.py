"""The store's own eviction policy in the simulator: StoreARC drives kvstore.meta.eviction_arc's
ARCEviction as the store drives it (a stored block is `added`, a loaded one `used`, a full cache
asks `victims` for one block and `removed`s it), so what the study measures for `--eviction arc` is
what the store runs. PrefixARC: the same with a request's blocks used tail first (as PrefixLRU).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from kvstore.bench.trace.policies import Held
from kvstore.meta.eviction_arc import ARCEviction


class _Block:
    """The entry a simulated block shows the store's policy: one byte, one replica."""

    size = 1

    @staticmethod
    def replicas() -> tuple[int]:
        return (0,)


class _Everything:
    """The scope of a simulated cache: every block held."""

    def __init__(self, held: Callable[[Hashable], bool]) -> None:
        self._held = held

    def least_recent(self) -> Iterator[tuple[str, Any]]:
        return iter(())

    def entry(self, key: str) -> Any:
        return _Block if self._held(key) else None


class StoreARC(Held):
    """The store's own ARCEviction (kvstore.meta.eviction_arc), driven as the store drives it: a
    stored block is `added`, a loaded one `used`, and a full cache asks `victims` for one block
    and `removed`s it. What the study measures for ARC is what the store runs."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.policy = ARCEviction()
        self._scope = _Everything(self._holds)

    def _holds(self, block: Hashable) -> bool:
        return block in self.policy.t1 or block in self.policy.t2

    def __len__(self) -> int:
        return len(self.policy.t1) + len(self.policy.t2)

    def load(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            self.policy.used(block)  # type: ignore[arg-type]

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in blocks:
            if self._holds(block):
                continue
            if len(self) >= self.capacity:
                for victim in self.policy.victims(self._scope, _never, 1):
                    self.policy.removed(victim)
                    self.evictions += 1
            self.policy.added(block)  # type: ignore[arg-type]


def _never(key: str) -> bool:
    return False


class PrefixARC(StoreARC):
    """StoreARC with a request's blocks used and stored tail first (as PrefixLRU): of one chain
    the head is the most recent. The store does not do this (its reads touch keys in order)."""

    def load(self, blocks: Sequence[Hashable]) -> None:
        super().load(blocks[::-1])

    def store(self, blocks: Sequence[Hashable]) -> None:
        super().store(blocks[::-1])
