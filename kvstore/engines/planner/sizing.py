"""The planner's formulas: per-instance throughput (given, measured or estimated), how many prefill
and decode instances a workload needs, the KV traffic of the PD hand-off on each link, and the
store capacity that keeps a prefix-hit rate. docs/planning.md states each formula and its source.

Nothing here prints or exits: an impossible plan raises PlanError with a one-line reason.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvstore.engines.planner import PlanError
from kvstore.engines.planner.hardware import Accelerator
from kvstore.engines.planner.model import ModelShape


@dataclass(frozen=True)
class Workload:
    request_rate: float = 1.0  # requests/s
    input_tokens: int = 2048  # prompt tokens per request
    output_tokens: int = 256
    prefix_hit_rate: float = 0.0  # share of prompt tokens whose KV kvstore already holds

    def __post_init__(self) -> None:
        if self.request_rate <= 0 or self.input_tokens <= 0 or self.output_tokens <= 0:
            raise PlanError("--request-rate, --input-tokens and --output-tokens must be positive")
        if not 0.0 <= self.prefix_hit_rate < 1.0:
            raise PlanError(f"--prefix-hit-rate must be in [0, 1), got {self.prefix_hit_rate}")

    @property
    def input_token_rate(self) -> float:
        return self.request_rate * self.input_tokens

    @property
    def computed_input_rate(self) -> float:
        """Prompt tokens/s the prefill instances compute: cached prefixes are loaded instead."""
        return self.input_token_rate * (1 - self.prefix_hit_rate)

    @property
    def output_token_rate(self) -> float:
        return self.request_rate * self.output_tokens


@dataclass(frozen=True)
class Deployment:
    """One instance's hardware and the targets and assumptions the plan is made under."""

    accelerator: Accelerator
    gpus: int = 1  # per instance (tensor parallel)
    memory_utilization: float = 0.9  # share of memory the engine takes (vLLM's default)
    kv_memory_bytes: int | None = None  # KV cache per decode instance, if given (else derived)
    mfu: float = 0.5  # prefill: share of peak FLOP/s achieved
    bandwidth_utilization: float = 0.8  # decode: share of peak memory bandwidth achieved
    tpot_s: float = 0.05  # decode target: time per output token
    ttft_s: float = 2.0  # target: time to first token
    link_bytes_per_s: float = 25e9  # network per instance (200 Gbit/s)
    retention_s: float = 300.0  # how long the store keeps a prefix for reuse

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise PlanError(f"--tp must be at least 1, got {self.gpus}")
        for name in ("memory_utilization", "mfu", "bandwidth_utilization"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise PlanError(f"--{name.replace('_', '-')} must be in (0, 1], got {getattr(self, name)}")
        for name, flag in (
            ("tpot_s", "--tpot"),
            ("ttft_s", "--ttft"),
            ("link_bytes_per_s", "--link-gbps"),
            ("retention_s", "--retention"),
        ):
            if getattr(self, name) <= 0:
                raise PlanError(f"{flag} must be positive, got {getattr(self, name)}")
        if self.kv_memory_bytes is not None and self.kv_memory_bytes <= 0:
            raise PlanError("--kv-memory must be positive")

    @property
    def usable_memory(self) -> float:
        return self.accelerator.memory_bytes * self.gpus * self.memory_utilization

    @property
    def flops(self) -> float:
        return self.accelerator.flops * self.gpus * self.mfu

    @property
    def memory_bandwidth(self) -> float:
        return self.accelerator.memory_bandwidth * self.gpus * self.bandwidth_utilization


@dataclass(frozen=True)
class Throughput:
    prefill_tps: float  # prompt tokens/s one prefill instance computes
    decode_tps: float  # output tokens/s one decode instance generates (all streams)
    stream_tps: float  # output tokens/s of one stream (1 / TPOT)
    source: str = "given"
    prefill_how: str = ""  # how an estimated figure was derived
    decode_how: str = ""

    def __post_init__(self) -> None:
        for name, flag in (
            ("prefill_tps", "--prefill-tps"),
            ("decode_tps", "--decode-tps"),
            ("stream_tps", "--stream-tps"),
        ):
            value = getattr(self, name)
            if not value > 0 or math.isinf(value):
                raise PlanError(f"{flag} must be a positive number of tokens/s, got {value}")


def kv_budget(model: ModelShape, dep: Deployment) -> float:
    """KV cache bytes one decode instance holds: given, or its usable memory less the weights."""
    if dep.kv_memory_bytes is not None:
        return dep.kv_memory_bytes
    weights = model.weights_bytes
    if weights is None:
        raise PlanError(
            f"{model.name}: its parameter count is unknown, so is the memory left for KV: "
            "give --params, or the KV cache size with --kv-memory"
        )
    if weights >= dep.usable_memory:
        per_gpu = dep.accelerator.memory_bytes * dep.memory_utilization
        tp = 1 << (max(dep.gpus + 1, math.ceil(weights / per_gpu)) - 1).bit_length()  # a power of 2
        raise PlanError(
            f"{model.name}'s weights ({weights / 2**30:.1f} GiB) do not fit "
            f"{dep.gpus} x {dep.accelerator.name} ({dep.usable_memory / 2**30:.1f} GiB usable): "
            f"use --tp {tp} or more, or a larger --gpu"
        )
    return dep.usable_memory - weights


def estimate(model: ModelShape, workload: Workload, dep: Deployment, context_tokens: int) -> Throughput:
    """Roofline estimates: prefill is compute-bound (FLOPs per token at the accelerator's FLOP/s
    x MFU); decode is bandwidth-bound (each step reads the weights and every stream's KV), with
    as many streams as keep a step within the TPOT target and fit in memory."""
    flops_per_token = model.flops_per_prompt_token(workload.input_tokens)
    if flops_per_token is None or model.weights_bytes is None:
        raise PlanError(
            f"{model.name}: its parameter count is unknown, so throughput cannot be estimated: "
            "give --params (and --active-params for MoE), or --prefill-tps, --decode-tps and --stream-tps"
        )
    prefill_tps = dep.flops / flops_per_token
    by_memory = int(kv_budget(model, dep) // (context_tokens * model.kv_bytes_per_token))
    per_stream = (workload.input_tokens + workload.output_tokens / 2) * model.kv_bytes_per_token  # read per step
    weights = model.weights_bytes
    by_tpot = math.floor((dep.tpot_s * dep.memory_bandwidth - weights) / per_stream)
    if by_tpot < 1:
        raise PlanError(
            f"a {dep.tpot_s * 1e3:.0f} ms TPOT is out of reach: one decode step reads "
            f"{weights / 2**30:.1f} GiB of weights and {per_stream / 2**30:.2f} GiB of KV a stream "
            f"at {dep.memory_bandwidth / 1e12:.2f} TB/s: use --tp, a faster --gpu, or a longer --tpot"
        )
    streams = min(by_tpot, by_memory)
    if streams < 1:
        raise _no_fit(model, dep, context_tokens)
    step = (weights + streams * per_stream) / dep.memory_bandwidth
    g = dep.gpus
    return Throughput(
        prefill_tps,
        streams / step,
        1 / step,
        "estimated",
        prefill_how=(
            f"{dep.accelerator.flops / 1e12:,.0f} TFLOP/s x {g} GPU x {dep.mfu:.2f} MFU / "
            f"{flops_per_token / 1e9:.1f} GFLOP a token"
        ),
        decode_how=(
            f"{streams} streams ({'memory' if by_memory < by_tpot else 'TPOT'}-bound), a step reads "
            f"{weights / 2**30:.1f} GiB of weights + {streams} x {per_stream / 2**20:,.0f} MiB of KV "
            f"at {dep.accelerator.memory_bandwidth / 1e12:.2f} TB/s x {g} x {dep.bandwidth_utilization:.2f}"
        ),
    )


def _no_fit(model: ModelShape, dep: Deployment, context_tokens: int) -> PlanError:
    need = context_tokens * model.kv_bytes_per_token
    return PlanError(
        f"one request's KV ({need / 2**30:.2f} GiB for {context_tokens} tokens) does not fit the "
        f"{kv_budget(model, dep) / 2**30:.2f} GiB a decode instance has for KV: "
        "use --tp, a larger --gpu, a shorter --context, or a smaller --dtype"
    )


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    workload: Workload
    deployment: Deployment
    throughput: Throughput
    context_tokens: int  # tokens of KV a request holds while it decodes

    def __post_init__(self) -> None:
        if self.context_tokens <= 0:
            raise PlanError(f"--context must be positive, got {self.context_tokens}")
        window = self.model.sliding_window
        if window is not None and self.context_tokens > window:
            raise PlanError(
                f"{self.model.name} attends to a {window}-token sliding window: KV beyond it is "
                f"not modelled; plan --context {window} or less"
            )
        if self.requests_per_instance < 1:
            raise _no_fit(self.model, self.deployment, self.context_tokens)

    # -- memory --------------------------------------------------------------------------------

    @property
    def kv_bytes_per_request(self) -> int:
        return self.model.kv_bytes_per_token * self.context_tokens

    @property
    def prompt_kv_bytes(self) -> int:
        """What the PD hand-off moves per request: the prompt's KV."""
        return self.model.kv_bytes_per_token * self.workload.input_tokens

    @property
    def kv_budget(self) -> float:
        return kv_budget(self.model, self.deployment)

    @property
    def requests_per_instance(self) -> int:
        return int(self.kv_budget // self.kv_bytes_per_request)

    # -- instances -----------------------------------------------------------------------------

    @property
    def prefill_instances(self) -> int:
        return math.ceil(self.workload.computed_input_rate / self.throughput.prefill_tps)

    @property
    def concurrent_decodes(self) -> float:
        """Little's law: streams decoding at once = request rate x time each spends decoding."""
        return self.workload.request_rate * self.workload.output_tokens / self.throughput.stream_tps

    @property
    def decode_instances(self) -> int:
        return max(self.decode_instances_by_rate, self.decode_instances_by_memory)

    @property
    def decode_instances_by_rate(self) -> int:
        return math.ceil(self.workload.output_token_rate / self.throughput.decode_tps)

    @property
    def decode_instances_by_memory(self) -> int:
        return math.ceil(self.concurrent_decodes / self.requests_per_instance)

    # -- KV traffic ----------------------------------------------------------------------------

    @property
    def store_write_rate(self) -> float:
        """Bytes/s the prefill instances store: the KV of the prompt tokens they compute."""
        return self.workload.computed_input_rate * self.model.kv_bytes_per_token

    @property
    def decode_read_rate(self) -> float:
        """Bytes/s the decode instances load: every prompt's whole KV (PD hand-off)."""
        return self.workload.input_token_rate * self.model.kv_bytes_per_token

    @property
    def prefill_read_rate(self) -> float:
        """Bytes/s the prefill instances load: the cached prefixes they do not recompute."""
        return self.workload.input_token_rate * self.workload.prefix_hit_rate * self.model.kv_bytes_per_token

    @property
    def prefill_link_rate(self) -> float:
        return (self.store_write_rate + self.prefill_read_rate) / self.prefill_instances

    @property
    def decode_link_rate(self) -> float:
        return self.decode_read_rate / self.decode_instances

    @property
    def store_traffic(self) -> float:
        return self.store_write_rate + self.prefill_read_rate + self.decode_read_rate

    @property
    def store_links(self) -> int:
        """Links of the per-instance speed the store's own hosts need for that traffic."""
        return math.ceil(self.store_traffic / self.deployment.link_bytes_per_s)

    @property
    def links_ok(self) -> bool:
        link = self.deployment.link_bytes_per_s
        return self.prefill_link_rate <= link and self.decode_link_rate <= link

    @property
    def store_capacity(self) -> float:
        """Little's law for bytes: new KV written per second x how long it is kept."""
        return self.store_write_rate * self.deployment.retention_s

    # -- latency -------------------------------------------------------------------------------

    @property
    def prefill_s(self) -> float:
        """One prompt's uncached part, computed alone on a prefill instance."""
        return self.workload.input_tokens * (1 - self.workload.prefix_hit_rate) / self.throughput.prefill_tps

    @property
    def transfer_s(self) -> float:
        """The prompt's KV over one link, once (the hand-off to decode; a cached prefix's load
        into the prefill instance is another share of it)."""
        return self.prompt_kv_bytes * (1 + self.workload.prefix_hit_rate) / self.deployment.link_bytes_per_s

    @property
    def ttft_estimate_s(self) -> float:
        """Uncontended: prefill + KV moves + one decode step (queueing is not modelled)."""
        return self.prefill_s + self.transfer_s + 1 / self.throughput.stream_tps

    def to_dict(self) -> dict[str, Any]:
        names = (
            "kv_bytes_per_request",
            "prompt_kv_bytes",
            "kv_budget",
            "requests_per_instance",
            "prefill_instances",
            "decode_instances",
            "decode_instances_by_rate",
            "decode_instances_by_memory",
            "concurrent_decodes",
            "store_write_rate",
            "decode_read_rate",
            "prefill_read_rate",
            "prefill_link_rate",
            "decode_link_rate",
            "store_traffic",
            "store_links",
            "links_ok",
            "store_capacity",
            "prefill_s",
            "transfer_s",
            "ttft_estimate_s",
        )
        return {
            **asdict(self),
            "kv_bytes_per_token": self.model.kv_bytes_per_token,
            "weights_bytes": self.model.weights_bytes,
            **{n: getattr(self, n) for n in names},
        }
