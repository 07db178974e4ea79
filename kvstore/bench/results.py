"""What a bench run measures, as plain frozen values (written out as JSON by the runner).

Every measurement is repeated (at least three times in a full run) and keeps every repetition:
reports give min / median / max, never the best alone. Rates are decimal: GB/s is 1e9 bytes per
second.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Spread:
    """Repetitions of one measurement; judged by the median."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a spread needs at least one sample")

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        return cls(tuple(float(v) for v in values))

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def n(self) -> int:
        return len(self.samples)

    def scaled(self, factor: float) -> Spread:
        return Spread(tuple(s * factor for s in self.samples))


@dataclass(frozen=True)
class Ceiling:
    """A bound measured in the same run: what the hardware and kernel allow without the store."""

    name: str  # "memcpy", "tcp socket" (streaming) or "tcp req/reply"
    size: int  # bytes per copy / message
    gbps: Spread


@dataclass(frozen=True)
class Throughput:
    """Put or get throughput through a client. `path` names what was measured ("shm", "tcp",
    "mooncake-store", "redis"), `batch` is keys per call (1 for single-key calls). op "get" is a
    first read (the reading client never read the key), "get-warm" the same keys read again."""

    path: str
    op: str  # "put", "get" or "get-warm"
    size: int
    batch: int
    ops: int  # keys moved per repetition
    seconds: tuple[float, ...]  # per repetition

    @property
    def gbps(self) -> Spread:
        return Spread.of(self.ops * self.size / s / 1e9 for s in self.seconds)

    @property
    def ops_per_s(self) -> Spread:
        return Spread.of(self.ops / s for s in self.seconds)

    @property
    def mode(self) -> str:
        return "single" if self.batch == 1 else "batched"


@dataclass(frozen=True)
class Latency:
    """Per-call latency percentiles of one operation on one value size, per repetition. op "get"
    reads keys the client never read, "get-warm" keys it read before; a peer may add its own
    (e.g. Redis "get-tiny": a GET of an 8-byte value)."""

    path: str
    op: str
    size: int
    ops: int  # calls per repetition
    p50_us: Spread
    p99_us: Spread


@dataclass(frozen=True)
class ServerCpu:
    """CPU time (user + system) the store's server processes spent per call of a latency loop,
    per repetition: for kvstore the metadata service and the daemon, for Mooncake Store its
    master and the server holding the segment."""

    path: str
    op: str  # "put", "get" or "pair" (one put plus one first get)
    size: int
    us_per_op: Spread
    processes: str  # what was counted, for the report


@dataclass(frozen=True)
class PrefixRate:
    """match_prefix over batches of keys that are all present, so the whole batch is walked.
    `path` is "kvstore" (metadata only, so one number for every transport) or a baseline's label,
    e.g. "mooncake-store" for its batch_is_exist."""

    batch: int
    calls: int  # per repetition
    seconds: tuple[float, ...]
    path: str = "kvstore"

    @property
    def keys_per_s(self) -> Spread:
        return Spread.of(self.batch * self.calls / s for s in self.seconds)


@dataclass(frozen=True)
class EngineLoad:
    """The engines' KV load path against raw get_many_into of the same bytes in the same store,
    and decode TTFT with KV from the store against recomputing it (reference engine)."""

    what: str  # e.g. "reference codec, layer objects"
    prompt_tokens: int
    nbytes: int  # KV bytes one load moves
    load_gbps: Spread
    raw_gbps: Spread  # get_many_into of the same bytes as the bench's large objects
    ttft_load_s: Spread | None = None
    ttft_recompute_s: Spread | None = None


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

    name: str  # "mooncake", "redis"
    path: str  # the label of its results, e.g. "mooncake-store"
    setup: str  # how it ran, for the report
    unavailable: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class TargetCheck:
    """One issue target: the value's repetitions against a reference measured in the same run
    (a ceiling, a peer, or the target itself for an absolute one). ratio = value / median of the
    reference, per repetition; met when the median ratio is >= need (<= need when lower is
    better)."""

    name: str
    unit: str
    value: Spread
    reference: Spread
    reference_text: str  # e.g. "memcpy 256 MiB" or "mooncake-store get p50"
    need: float
    higher_is_better: bool = True
    issue: int = 0

    @property
    def ratio(self) -> Spread:
        ref = self.reference.median
        return Spread.of(v / ref if ref else float("nan") for v in self.value.samples)

    @property
    def met(self) -> bool:
        r = self.ratio.median
        return r >= self.need if self.higher_is_better else r <= self.need


@dataclass
class Results:
    """Everything one run measured; sections append to it."""

    ceilings: list[Ceiling] = field(default_factory=list)
    throughput: list[Throughput] = field(default_factory=list)
    latency: list[Latency] = field(default_factory=list)
    server_cpu: list[ServerCpu] = field(default_factory=list)
    prefix: list[PrefixRate] = field(default_factory=list)
    engine: list[EngineLoad] = field(default_factory=list)
    meta_memory: list[MetaMemory] = field(default_factory=list)
    baselines: list[Baseline] = field(default_factory=list)
    tiers: list[Any] = field(default_factory=list)  # kvstore.bench.tiers.TierResult
    skipped: list[Skipped] = field(default_factory=list)

    def ceiling(self, name: str, size: int) -> Ceiling | None:
        return next((c for c in self.ceilings if c.name == name and c.size == size), None)

    def extend(self, other: Results) -> None:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))


_DERIVED = ("gbps", "ops_per_s", "mode", "keys_per_s", "bytes_per_block", "ratio", "ratios", "met")


def to_json(obj: Any) -> Any:
    """A JSON-ready form of any result, with its derived values included."""
    if isinstance(obj, list | tuple):
        return [to_json(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, Results):
        return {name: to_json(value) for name, value in vars(obj).items()}
    if isinstance(obj, Spread):
        return {"samples": list(obj.samples), "min": obj.min, "median": obj.median, "max": obj.max}
    if not hasattr(obj, "__dataclass_fields__"):
        return obj
    data = {f.name: to_json(getattr(obj, f.name)) for f in fields(obj)}
    for name in _DERIVED:
        if isinstance(getattr(type(obj), name, None), property):
            data[name] = to_json(getattr(obj, name))
    return data


def message(result: Throughput | Latency | PrefixRate | ServerCpu) -> dict[str, Any]:
    """A result as a JSON message (a peer's child process sends its results this way)."""
    return {"type": type(result).__name__, **asdict(result)}


def from_message(data: dict[str, Any]) -> Throughput | Latency | PrefixRate | ServerCpu:
    """The inverse of `message`."""
    data = dict(data)
    kind = data.pop("type")
    for name in ("p50_us", "p99_us", "us_per_op"):
        if name in data:
            data[name] = Spread(tuple(data[name]["samples"]))
    if "seconds" in data:
        data["seconds"] = tuple(data["seconds"])
    types: dict[str, Any] = {"Throughput": Throughput, "Latency": Latency, "PrefixRate": PrefixRate}
    types["ServerCpu"] = ServerCpu
    result: Throughput | Latency | PrefixRate | ServerCpu = types[kind](**data)
    return result
