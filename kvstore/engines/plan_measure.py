"""`kvstore plan --measure`: size a PD fleet from measured throughputs and the SLOs.

Measures one reference-engine instance, in this process or running (`--instance URL`):

    prefill throughput   prompt tokens/s, computing prompts of --input-tokens as the engine serves them
    decode step time     seconds per step of B sequences decoding together at context
                         ~ input + output / 2, for each B in --batches (output tokens/s = B / step)

then applies the formulas, with headroom for the SLOs:

    B*                  the largest batch whose step time (interpolated) meets the TPOT SLO
    decode instances    ceil(output token rate / (decode tokens/s at B*  x  --decode-utilization))
    prefill instances   ceil(input token rate / prefill tokens/s), plus one at a time until the
                        prefill queue's wait at the --slo-attainment quantile (M/D/c: half the
                        M/M/c wait, Erlang C) + the prefill + two decode steps fits the TTFT SLO

and replays the workload through the planned fleet, and through one instance fewer of each kind,
on the reference engine's own scheduler with the measured step times (`fleet_sim.py`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from kvstore.engines.planner.fleet import FleetLoad, StepCost, simulate_fleet
from kvstore.engines.planner.model import ModelShape
from kvstore.engines.reference.scheduler import SchedulerConfig


class PlanError(ValueError):
    """The SLOs cannot be met by any number of instances of what was measured."""


@dataclass(frozen=True)
class FleetWorkload:
    request_rate: float  # requests/s
    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.request_rate <= 0 or self.input_tokens < 1 or self.output_tokens < 1:
            raise ValueError("request rate, input and output tokens must be positive")


@dataclass(frozen=True)
class Objectives:
    ttft_s: float
    tpot_s: float
    attainment: float = 0.9  # share of requests that must meet both

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0 or not 0 < self.attainment < 1:
            raise ValueError("SLOs must be positive and the attainment in (0, 1)")


@dataclass(frozen=True)
class MeasuredPlan:
    workload: FleetWorkload
    slo: Objectives
    cost: StepCost
    batch: int  # B*
    prefill_base: int  # ceil(input token rate / prefill tokens/s)
    decode_base: int  # ceil(output token rate / decode tokens/s at B*)
    prefill_instances: int
    decode_instances: int
    ttft_estimate_s: float  # at the attainment quantile, with prefill_instances
    source: str = "given"

    @property
    def decode_tps(self) -> float:
        return self.batch / self.cost.decode_step_s(self.batch)


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with `offered` = arrival rate x service time."""
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    return servers * b / (servers - offered * (1 - b))


def prefill_wait_s(servers: int, rate: float, service_s: float, quantile: float) -> float:
    """The wait at `quantile` for a prefill instance, M/D/c approximated as half of M/M/c."""
    if rate * service_s >= servers:
        return math.inf
    waits = erlang_c(servers, rate * service_s)
    if waits <= 1 - quantile:
        return 0.0
    return 0.5 * math.log(waits / (1 - quantile)) / (servers / service_s - rate)


def size_fleet(
    workload: FleetWorkload,
    slo: Objectives,
    cost: StepCost,
    max_batch: int,
    decode_utilization: float = 0.95,
    source: str = "given",
) -> MeasuredPlan:
    """The planned counts (module docstring). Raises PlanError if no fleet can meet the SLOs."""
    if not 0 < decode_utilization <= 1:
        raise ValueError("decode utilization must be in (0, 1]")
    fits = [b for b in range(1, max_batch + 1) if cost.decode_step_s(b) <= slo.tpot_s]
    if not fits:
        raise PlanError(
            f"one stream's decode step takes {cost.decode_step_s(1) * 1e3:.1f} ms: "
            f"over the {slo.tpot_s * 1e3:g} ms TPOT SLO"
        )
    batch = max(fits)
    decode_tps = batch / cost.decode_step_s(batch)
    output_rate = workload.request_rate * workload.output_tokens
    decode_base = math.ceil(output_rate / decode_tps)
    decode = math.ceil(output_rate / (decode_tps * decode_utilization))
    service = workload.input_tokens / cost.prefill_tps
    fixed = service + 2 * cost.decode_step_s(batch)
    if fixed > slo.ttft_s:
        raise PlanError(
            f"a prompt of {workload.input_tokens} tokens takes {service:.2f} s to prefill: "
            f"over the {slo.ttft_s:g} s TTFT SLO"
        )
    prefill_base = prefill = math.ceil(workload.request_rate * service)
    while fixed + prefill_wait_s(prefill, workload.request_rate, service, slo.attainment) > slo.ttft_s:
        prefill += 1
    ttft = fixed + prefill_wait_s(prefill, workload.request_rate, service, slo.attainment)
    return MeasuredPlan(workload, slo, cost, batch, prefill_base, decode_base, prefill, decode, ttft, source)


def check(
    plan: MeasuredPlan, requests: int = 2000, seed: int = 0, batching: SchedulerConfig | None = None
) -> dict[tuple[int, int], float]:
    """SLO attainment, simulated at the plan's rate, of the planned fleet and of one instance
    fewer of each kind: {(prefill, decode): attainment}."""
    w, p, d = plan.workload, plan.prefill_instances, plan.decode_instances
    load = FleetLoad(w.request_rate, w.input_tokens, w.output_tokens, requests, seed)
    fleets = [(p, d)] + [f for f in ((p - 1, d), (p, d - 1)) if min(f) >= 1]
    return {
        f: simulate_fleet(*f, load, plan.cost, batching).attainment(plan.slo.ttft_s, plan.slo.tpot_s) for f in fleets
    }


# -- measuring ---------------------------------------------------------------------------------


def measure_in_process(
    input_tokens: int,
    output_tokens: int,
    batches: list[int],
    steps: int = 6,
    batching: SchedulerConfig | None = None,
    threads: int = 1,
) -> StepCost:
    """Prefill throughput through a reference engine (chunked as it serves), and the model's
    decode step time for each batch size over the paged cache, every sequence at the same
    context (one prompt's blocks shared, the new tokens in blocks of their own). With `threads`
    torch threads, as an instance started with `--threads` (1, as `kvstore demo` runs them)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _measure(input_tokens, output_tokens, batches, steps, batching or SchedulerConfig())
    finally:
        torch.set_num_threads(before)


def _measure(
    input_tokens: int, output_tokens: int, batches: list[int], steps: int, batching: SchedulerConfig
) -> StepCost:
    import torch

    from kvstore.engines.reference.engine import EngineConfig, GenerationRequest, ReferenceEngine
    from kvstore.engines.reference.model import ModelConfig, ReferenceModel
    from kvstore.engines.reference.paged_cache import Chunk

    model = ReferenceModel(ModelConfig())
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (input_tokens,), generator=gen).tolist()
    bs = 16
    context = max(bs, (input_tokens + output_tokens // 2) // bs * bs)
    own = -(-(steps + 1) // bs)
    engine = ReferenceEngine(
        model,
        EngineConfig(
            block_size=bs, batching=batching, cache_blocks=context // bs + max(batches) * own + input_tokens // bs + 4
        ),
    )
    engine.generate(GenerationRequest("warm", prompt[:64], 1), lambda t: None)
    rates = []
    for i in range(2):
        m = engine.generate(GenerationRequest(f"p{i}", prompt, 1), lambda t: None).metrics
        rates.append(input_tokens / m.prefill_compute_s)
    cache = engine.cache
    shared = cache.allocate(context // bs)
    long_prompt = (prompt * (context // len(prompt) + 1))[:context]
    for start in range(0, context, batching.max_batch_tokens):
        model.forward_batch([Chunk(long_prompt[start : start + batching.max_batch_tokens], start, shared)], cache)
    table = []
    for batch in batches:
        tables = [shared + cache.allocate(own) for _ in range(batch)]
        times = []
        for step in range(steps):
            begin = time.perf_counter()
            model.forward_batch([Chunk([1], context + step, t) for t in tables], cache)
            times.append(time.perf_counter() - begin)
        table.append((batch, statistics.median(times[1:] or times)))
        for t in tables:
            cache.free(t[len(shared) :])
    return StepCost(statistics.median(rates), tuple(table))


def measure_instance(url: str, input_tokens: int, output_tokens: int, batches: list[int], steps: int = 8) -> StepCost:
    """The same from a running reference engine over HTTP: prefill throughput from its own
    timing of prompts sent alone, decode step time as the median gap between tokens of B requests
    sent together (the same prompt each: an instance with a store loads it instead of computing)."""
    import asyncio
    import random

    import httpx

    rng = random.Random(0)
    context = input_tokens + output_tokens // 2
    prompt = [rng.randrange(256) for _ in range(context)]

    async def complete(http: httpx.AsyncClient, tokens: list[int], max_tokens: int) -> dict[str, Any]:
        resp = await http.post(f"{url}/v1/completions", json={"prompt": tokens, "max_tokens": max_tokens})
        resp.raise_for_status()
        record: dict[str, Any] = resp.json()["kvstore"]
        return record

    async def main() -> StepCost:
        async with httpx.AsyncClient(timeout=600) as http:
            rates = []
            for _ in range(3):
                m = await complete(http, [rng.randrange(256) for _ in range(input_tokens)], 1)
                rates.append(m["prefill_tokens"] / m["prefill_compute_s"])
            await complete(http, prompt, 1)
            table = []
            for batch in batches:
                records = await asyncio.gather(*(complete(http, prompt, steps + 1) for _ in range(batch)))
                table.append((batch, statistics.median(g for r in records for g in r["itl_s"])))
            return StepCost(statistics.median(rates), tuple(table))

    return asyncio.run(main())


# -- the command -------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--measure", "size a PD fleet from measurements of the reference engine")
    g.add_argument("--instance", default=None, help="measure this running reference engine (URL) instead")
    g.add_argument("--batches", default="1,4,16,32,64", help="decode batch sizes to measure")
    g.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT objective, seconds")
    g.add_argument("--slo-tpot", type=float, default=0.025, help="TPOT objective, seconds")
    g.add_argument("--slo-attainment", type=float, default=0.9, help="share of requests that must meet both")
    g.add_argument(
        "--decode-utilization",
        type=float,
        default=0.95,
        help="share of the decode throughput at B* to plan for (headroom for bursts)",
    )
    g.add_argument("--threads", type=int, default=1, help="torch threads while measuring in process")
    g.add_argument("--no-check", action="store_true", help="do not replay the plan in the fleet simulation")


def run(args: argparse.Namespace, shape: ModelShape) -> int:
    """`kvstore plan --measure` for the model `shape` (the flags' preset or config.json); prints the
    measurements, the plan and its check."""
    from kvstore.engines.planner.report import human_bytes

    batches = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    workload = FleetWorkload(args.request_rate, args.input_tokens, args.output_tokens)
    slo = Objectives(args.slo_ttft, args.slo_tpot, args.slo_attainment)
    source = f"measured on {args.instance}" if args.instance else "measured on the reference engine (in process)"
    cost = (
        measure_instance(args.instance, args.input_tokens, args.output_tokens, batches)
        if args.instance
        else measure_in_process(args.input_tokens, args.output_tokens, batches, threads=args.threads)
    )
    print(f"model {shape.name}: KV per token {human_bytes(shape.kv_bytes_per_token)}")
    print(
        f"{source}: prefill {cost.prefill_tps:,.0f} tok/s; decode step "
        + ", ".join(f"B={b} {s * 1e3:.1f} ms ({b / s:,.0f} tok/s)" for b, s in cost.decode_steps)
    )
    try:
        plan = size_fleet(workload, slo, cost, max(batches), args.decode_utilization, source)
    except PlanError as exc:
        print(f"kvstore plan: no fleet meets these SLOs: {exc}", file=sys.stderr)
        return 1
    w = workload
    print(
        f"workload: {w.request_rate:g} req/s x ({w.input_tokens} in + {w.output_tokens} out) = "
        f"{w.request_rate * w.input_tokens:,.0f} input + {w.request_rate * w.output_tokens:,.0f} output tokens/s; "
        f"SLO TTFT <= {slo.ttft_s:g} s, TPOT <= {slo.tpot_s * 1e3:g} ms for {slo.attainment:.0%} of requests"
    )
    print(
        f"  B* = {plan.batch} (step {cost.decode_step_s(plan.batch) * 1e3:.1f} ms <= TPOT SLO), decode "
        f"{plan.decode_tps:,.0f} tok/s per instance"
    )
    print(
        f"  prefill instances {plan.prefill_instances}   (ceil({w.request_rate * w.input_tokens:,.0f} / "
        f"{cost.prefill_tps:,.0f}) = {plan.prefill_base}, "
        f"queue headroom +{plan.prefill_instances - plan.prefill_base}; "
        f"TTFT at p{slo.attainment * 100:g} ~{plan.ttft_estimate_s:.2f} s)"
    )
    print(
        f"  decode instances  {plan.decode_instances}   (ceil({w.request_rate * w.output_tokens:,.0f} / "
        f"{plan.decode_tps:,.0f}) = {plan.decode_base}, at {args.decode_utilization:.0%} utilization)"
    )
    if not args.no_check:
        print("simulated at this rate (the engine's scheduler, these step times), share within both SLOs:")
        for (p, d), share in check(plan).items():
            tag = "planned" if (p, d) == (plan.prefill_instances, plan.decode_instances) else "one fewer"
            print(
                f"  {p} prefill + {d} decode ({tag}): {share:.0%} "
                f"({'meets' if share >= slo.attainment else 'misses'} the {slo.attainment:.0%} objective)"
            )
    return 0
