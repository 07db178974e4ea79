"""What a bench run measures, as plain frozen values (written out as JSON by the runner).

Rates are decimal: GB/s is 1e9 bytes per second.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Ceiling:
    """A bound measured in the same run: what the hardware and kernel allow without the store."""

    name: str            # "memcpy" or "tcp socket"
    size: int            # bytes per copy / message
    gbps: float


@dataclass(frozen=True)
class Throughput:
    """Put or get throughput through the client. `path` names what was measured ("shm", "tcp";
    later e.g. "mooncake-tcp" or a tier), `batch` is keys per call (1 for single-key calls)."""

    path: str
    op: str              # "put" or "get"
    size: int
    batch: int
    ops: int             # keys moved while timed
    seconds: float
    repeats: int = 1     # the fastest of this many runs

    @property
    def gbps(self) -> float:
        return self.ops * self.size / self.seconds / 1e9

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds

    @property
    def mode(self) -> str:
        return "single" if self.batch == 1 else "batched"


@dataclass(frozen=True)
class Latency:
    """Per-call latency percentiles of one operation on one value size."""

    path: str
    op: str
    size: int
    ops: int
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class PrefixRate:
    """match_prefix over batches of keys that are all present, so the whole batch is walked.
    `path` is "kvstore" (metadata only, so one number for every transport) or a baseline's label,
    e.g. "mooncake-store" for its batch_is_exist."""

    batch: int
    calls: int           # per run
    seconds: float       # of the fastest run
    repeats: int = 1
    path: str = "kvstore"

    @property
    def keys_per_s(self) -> float:
        return self.batch * self.calls / self.seconds


@dataclass(frozen=True)
class MetaMemory:
    """Growth of a metadata service's resident memory per block it holds."""

    blocks: int
    rss_growth: int
    seconds: float

    @property
    def bytes_per_block(self) -> float:
        return self.rss_growth / self.blocks


@dataclass(frozen=True)
class Skipped:
    """A measurement that could not run, and why (e.g. shm against a store on another host)."""

    what: str
    reason: str


@dataclass(frozen=True)
class Baseline:
    """Another store measured in the same run for comparison (`--compare`). Its numbers are in
    Results.throughput / latency / prefix under `path`; `unavailable` says why there are none."""

    name: str                # "mooncake"
    path: str                # the label of its results, e.g. "mooncake-store"
    setup: str               # how it ran, for the report
    unavailable: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class TargetCheck:
    """One issue target: ratio = value / reference, met when ratio >= need (<= need when lower
    is better). A relative target has a measured ceiling as reference and need < 1 (e.g. 0.6 x
    memcpy); an absolute one has the target itself as reference and need 1."""

    name: str
    value: float
    unit: str
    reference: float
    reference_text: str      # e.g. "0.6 x memcpy 9.1 GB/s" or ">= 150k keys/s"
    need: float
    higher_is_better: bool = True

    @property
    def ratio(self) -> float:
        return self.value / self.reference if self.reference else float("nan")

    @property
    def met(self) -> bool:
        return self.ratio >= self.need if self.higher_is_better else self.ratio <= self.need


@dataclass
class Results:
    """Everything one run measured; sections append to it."""

    ceilings: list[Ceiling] = field(default_factory=list)
    throughput: list[Throughput] = field(default_factory=list)
    latency: list[Latency] = field(default_factory=list)
    prefix: list[PrefixRate] = field(default_factory=list)
    meta_memory: list[MetaMemory] = field(default_factory=list)
    baselines: list[Baseline] = field(default_factory=list)
    tiers: list[Any] = field(default_factory=list)        # kvstore.bench.tiers.TierResult
    skipped: list[Skipped] = field(default_factory=list)

    def ceiling(self, name: str, size: int) -> Ceiling | None:
        return next((c for c in self.ceilings if c.name == name and c.size == size), None)


def to_json(obj: Any) -> Any:
    """A JSON-ready form of any result, with its derived rates included."""
    if isinstance(obj, list):
        return [to_json(o) for o in obj]
    if isinstance(obj, Results):
        return {name: to_json(value) for name, value in vars(obj).items()}
    data = asdict(obj)
    for name in ("gbps", "ops_per_s", "mode", "keys_per_s", "bytes_per_block", "ratio", "met", "ratios"):
        if hasattr(type(obj), name):
            data[name] = getattr(obj, name)
    return data
