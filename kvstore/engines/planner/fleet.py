"""A PD fleet replayed on a virtual clock: P prefill and D decode instances, each running the
reference engine's own scheduler (`reference/scheduler.py`: continuous batching, chunked prefill,
preemption), with step times from measured costs (`StepCost`). What `kvstore plan --measure`
checks its plan against, and the plan's tests too: no machine noise, no sleeping.

A request arrives (Poisson), goes to the prefill instance with the fewest tokens left to
compute, is computed there (one output token), and is handed to the decode instance with the
fewest sequences, which loads its full blocks at once (the transfer is not modelled), recomputes
the tail and generates. TTFT runs from arrival to the decode instance's first token, as the
router measures it; TPOT is the mean gap between the decode instance's tokens.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from functools import partial

from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.reference.scheduler import Batch, Scheduler, SchedulerConfig
from kvstore.engines.reference.sequence import GenerationRequest, Sequence


@dataclass(frozen=True)
class StepCost:
    """How long one engine step takes: `decode_steps` are measured (batch size, seconds) of steps
    that only decode, interpolated linearly (and extended along the last segment); prompt tokens
    in a step add tokens / prefill_tps."""

    prefill_tps: float
    decode_steps: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        if self.prefill_tps <= 0 or not self.decode_steps:
            raise ValueError("a step cost needs a positive prefill throughput and at least one decode step")
        batches = [b for b, _ in self.decode_steps]
        if batches != sorted(set(batches)) or batches[0] < 1 or any(s <= 0 for _, s in self.decode_steps):
            raise ValueError(f"decode steps must be (batch, seconds) with increasing batches >= 1: {self.decode_steps}")

    def decode_step_s(self, batch: int) -> float:
        if batch <= 0:
            return 0.0
        points = self.decode_steps
        if len(points) == 1:
            return points[0][1] * batch / points[0][0]
        i = min(max(bisect.bisect_left([b for b, _ in points], batch), 1), len(points) - 1)
        (b0, s0), (b1, s1) = points[i - 1], points[i]
        return max(s0 + (s1 - s0) * (batch - b0) / (b1 - b0), 1e-9)

    def step_s(self, decodes: int, prefill_tokens: int) -> float:
        return self.decode_step_s(decodes) + prefill_tokens / self.prefill_tps


@dataclass(frozen=True)
class FleetLoad:
    """The offered load: Poisson arrivals of requests of one size."""

    request_rate: float
    input_tokens: int
    output_tokens: int
    requests: int = 400
    seed: int = 0


@dataclass
class FleetRun:
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)  # per request, aligned with ttft_s

    def attainment(self, ttft_slo_s: float, tpot_slo_s: float) -> float:
        """Share of requests meeting both objectives."""
        met = sum(t <= ttft_slo_s and p <= tpot_slo_s for t, p in zip(self.ttft_s, self.tpot_s))
        return met / len(self.ttft_s)


class _Blocks:
    """A block pool that only counts (the simulation holds no KV; ids are never reused)."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._next = 0

    @property
    def num_free(self) -> int:
        return self._free

    def allocate(self, n: int) -> list[int]:
        if n > self._free:
            raise ValueError(f"{n} blocks asked, {self._free} free")
        self._free -= n
        self._next += n
        return list(range(self._next - n, self._next))

    def free(self, ids: Seq[int]) -> None:
        self._free += len(ids)


class _Instance:
    def __init__(self, batching: SchedulerConfig, cache_blocks: int, block_size: int) -> None:
        self.scheduler = Scheduler(batching, _Blocks(cache_blocks), block_size)
        self.busy = False

    @property
    def pending_tokens(self) -> int:
        s = self.scheduler
        return sum(q.remaining for q in [*s.waiting, *s.running])

    @property
    def sequences(self) -> int:
        s = self.scheduler
        return len(s.waiting) + len(s.loading) + len(s.running)


class _NoSink:
    def token(self, token: int) -> None:
        pass

    def done(self, generation: object) -> None:
        pass

    def failed(self, error: Exception) -> None:
        pass


def simulate_fleet(
    prefill: int,
    decode: int,
    load: FleetLoad,
    cost: StepCost,
    batching: SchedulerConfig | None = None,
    block_size: int = 16,
    cache_blocks: int = 1 << 20,
) -> FleetRun:
    """Replay `load` through `prefill` + `decode` instances; every request completes."""
    if prefill < 1 or decode < 1:
        raise ValueError("a PD fleet needs at least one prefill and one decode instance")
    batching = batching or SchedulerConfig()
    rng = random.Random(load.seed)
    prefills = [_Instance(batching, cache_blocks, block_size) for _ in range(prefill)]
    decodes = [_Instance(batching, cache_blocks, block_size) for _ in range(decode)]
    events: list[tuple[float, int, Callable[[float], None]]] = []
    order = itertools.count()
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    run = FleetRun()

    def at(t: float, event: Callable[[float], None]) -> None:
        heapq.heappush(events, (t, next(order), event))

    def start(inst: _Instance, now: float) -> None:
        while not inst.busy and inst.scheduler.has_work():
            batch = inst.scheduler.schedule()
            for seq in batch.loads:  # the hand-off's KV: there at once
                inst.scheduler.loaded(seq, seq.to_load)
            if batch.chunks:
                inst.busy = True
                at(now + cost.step_s(batch.decodes, batch.prefill_tokens), partial(finish_step, inst, batch))
            elif not batch.loads:
                return

    def arrive(req: GenerationRequest, now: float) -> None:
        target = min(prefills, key=lambda p: p.pending_tokens)
        target.scheduler.add(_sequence(req, 1))
        start(target, now)

    def finish_step(inst: _Instance, batch: Batch, now: float) -> None:
        inst.busy = False
        for s in batch.chunks:
            seq = s.seq
            seq.num_computed += s.num_tokens
            if seq.remaining:
                continue
            seq.tokens.append(0)
            rid = seq.request.request_id
            if inst in decodes:
                first.setdefault(rid, now)
                last[rid] = now
            if not seq.finished:
                continue
            inst.scheduler.finish(seq)
            if inst in prefills:  # hand the prompt's full blocks over
                target = min(decodes, key=lambda d: d.sequences)
                handed = _sequence(seq.request, load.output_tokens)
                handed.to_load = (len(seq.request.prompt) - 1) // block_size
                target.scheduler.add(handed)
                start(target, now)
            else:
                n = seq.num_generated
                run.ttft_s.append(first[rid] - seq.request.arrival)
                run.tpot_s.append((last[rid] - first[rid]) / (n - 1) if n > 1 else 0.0)
        start(inst, now)

    now = 0.0
    for i in range(load.requests):
        now += rng.expovariate(load.request_rate)
        at(now, partial(arrive, GenerationRequest(f"r{i}", [0] * load.input_tokens, load.output_tokens, arrival=now)))
    while events:
        now, _, event = heapq.heappop(events)
        event(now)
    return run


def _sequence(req: GenerationRequest, max_tokens: int) -> Sequence:
    return Sequence(req, _NoSink(), max_tokens, RequestMetrics(req.request_id, "sim"))
