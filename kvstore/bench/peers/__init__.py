"""Peer stores `kvstore bench --compare` measures beside kvstore, in the same run, with the same
loops (kvstore.bench.store and .latency) through an adapter for each:

    mooncake   Mooncake Store: mooncake_master + a server + a client process (peers/mooncake.py)
    redis      a redis-server the bench starts on a free port, through redis-py (peers/redis.py)

Each peer module offers `PATH` (the label of its results), `describe(spec)` and
`measure(spec, progress) -> PeerOutcome`, and is imported only when asked for. A peer that cannot
run (not installed, will not start) ends as PeerOutcome.unavailable with the reason, never as an
exception.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from kvstore.bench.latency import LatencyPlan
from kvstore.bench.results import Results
from kvstore.bench.store import ThroughputPlan

PEERS = {"mooncake": "kvstore.bench.peers.mooncake", "redis": "kvstore.bench.peers.redis"}
Progress = Callable[[str], None]


@dataclass(frozen=True)
class PeerSpec:
    """What a peer measures: the same sizes, plans and counts as kvstore's sections."""

    sizes: tuple[int, ...]
    plan: ThroughputPlan
    latency: LatencyPlan
    prefix_batch: int
    prefix_calls: int
    segment_size: int  # memory the peer's server offers (Mooncake's global segment)
    key_prefix: str
    pool_bytes: int  # source bytes every put takes its value from (kvstore.bench.store.SourcePool)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PeerSpec:
        data = json.loads(text)
        data["sizes"] = tuple(data["sizes"])
        data["plan"] = ThroughputPlan(**data["plan"])
        data["latency"] = LatencyPlan(**data["latency"])
        return cls(**data)


@dataclass
class PeerOutcome:
    """What one peer run produced; `unavailable` is set when it could not finish."""

    results: Results = field(default_factory=Results)
    notes: list[str] = field(default_factory=list)
    unavailable: str | None = None
    seconds: float = 0.0


class Peer(Protocol):
    PATH: str

    def describe(self, spec: PeerSpec) -> str: ...
    def measure(self, spec: PeerSpec, progress: Progress) -> PeerOutcome: ...


def peer(name: str) -> Peer:
    """The peer module of `name` (a key of PEERS)."""
    module: Peer = importlib.import_module(PEERS[name])
    return module
