"""Admission: which blocks a tier takes when the tier above lets them go (a demotion from GPU to
DRAM, or from DRAM to SSD). A block a tier does not admit is evicted instead of moved. Puts are
always admitted: refusing a new block breaks the chain a prompt's next turn would reuse, and in
disaggregated serving it is the KV a decode instance is about to load (docs/traces.md).

    all     every block demoted into the tier (today's behaviour, the default)
    reused  only blocks read (or touched by a reader of cached locations) since they were stored:
            the tier below keeps what was reused and does not spend its writes on blocks
            stored once and never read (most of a conversation trace's)

`reused` keeps one set entry per reused COMPLETE key and hears of every key's arrival, use and
departure as the index's watcher, O(1) each.
"""

from __future__ import annotations

from typing import Protocol


class Admission(Protocol):
    def admits(self, key: str) -> bool:
        """Whether the tier takes `key`'s block from the tier above."""


class AdmitAll:
    def admits(self, key: str) -> bool:
        return True


class AdmitReused:
    """Keys read since they were stored (an index Watcher)."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def added(self, key: str) -> None:
        self.read.discard(key)  # stored again: not read since

    def used(self, key: str) -> None:
        self.read.add(key)

    def removed(self, key: str) -> None:
        self.read.discard(key)

    def admits(self, key: str) -> bool:
        return key in self.read


def make_admission(name: str) -> Admission:
    return AdmitReused() if name == "reused" else AdmitAll()
