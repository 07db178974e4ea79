"""The plug-in point of `kvstore bench --compare`: peer stores measured beside kvstore in the same
run, with the same loops (kvstore.bench.store and .latency).

The peers themselves (Mooncake Store, Redis) are the repository's lab, not part of kvstore: they
live in the checkout's benchmarks/peers, which is not installed with kvstore. `--compare` imports
that plug-in by name (PEER_PLUGIN); importing it registers each peer (`register_peer`) and the
report of kvstore beside them (`register_comparison`). Where it is not importable (an installed
kvstore outside a checkout), `--compare` fails with one line saying where the peers are.

A peer module offers `PATH` (the label of its results), `describe(spec)` and
`measure(spec, progress) -> PeerOutcome`, and is imported only when asked for. A peer that cannot
run (not installed, will not start) ends as PeerOutcome.unavailable with the reason, never as an
exception.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from kvstore.bench.latency import LatencyPlan
from kvstore.bench.results import Results
from kvstore.bench.store import ThroughputPlan

PEER_PLUGIN = "benchmarks.peers"  # a package of the repository, found by name only (never imported statically)
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


@dataclass(frozen=True)
class Comparison:
    """kvstore beside the peers measured: a section of the report, and the JSON document's
    `comparison` (both given the whole run's results)."""

    render: Callable[[Results], str]
    document: Callable[[Results], dict[str, object]]


PEERS: dict[str, str] = {}  # peer name -> the module measuring it, filled by the plug-in
_comparison: list[Comparison] = []


def register_peer(name: str, module: str) -> None:
    PEERS[name] = module


def register_comparison(comparison: Comparison) -> None:
    _comparison[:] = [comparison]


def comparison() -> Comparison | None:
    """The registered report of kvstore beside its peers (None before the plug-in is loaded)."""
    return _comparison[0] if _comparison else None


def load(names: Sequence[str]) -> None:
    """Import the peer plug-in (registering its peers) and check `names` against them; ValueError,
    in one line, if it is not importable or a name is not one of its peers."""
    if not PEERS:
        _import_plugin()
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise ValueError(f"unknown --compare peers {unknown}; choose from {', '.join(PEERS)}")


def _import_plugin() -> None:
    # `python -m` puts the current directory on sys.path, the `kvstore` console script does not:
    # in a checkout's root, add it, so that `kvstore bench --compare` works there as well.
    here = Path.cwd()
    if (here / "benchmarks" / "peers" / "__init__.py").is_file() and str(here) not in sys.path:
        sys.path.insert(0, str(here))
    try:
        importlib.import_module(PEER_PLUGIN)
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", PEER_PLUGIN):
            raise
        raise ValueError(
            f"--compare needs the peer stores, which live in the kvstore repository's benchmarks/ "
            f"(not installed with kvstore): run it from the root of a checkout ({PEER_PLUGIN} is not importable here)"
        ) from None


def peer(name: str) -> Peer:
    """The peer module of `name` (a registered peer)."""
    module: Peer = importlib.import_module(PEERS[name])
    return module
