"""`kvstore plan`: the capacity planner of the PD design.

From a model's KV shape it derives the KV bytes per token and per request, how many requests'
KV fit a memory budget, and how many instances a workload needs:

    kv_bytes_per_token = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes
    prefill instances  = ceil(input token rate  / per-instance prefill tokens/s)
    decode instances   = max(ceil(output token rate / per-instance decode tokens/s),
                             ceil(requests decoding at once / requests whose KV fits one instance))

Requests decoding at once follow Little's law: request rate * output tokens / per-stream decode
tokens/s. Throughputs are given, or measured on the reference engine (`--measure`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

from kvstore.config import parse_size

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes) <= 0:
            raise ValueError("layers, kv_heads, head_dim and dtype bytes must be positive")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


PRESETS = {s.name: s for s in [
    ModelShape("llama2-7b", 32, 32, 128),        # hidden 4096, 32 heads, MHA
    ModelShape("llama2-13b", 40, 40, 128),
    ModelShape("llama2-70b", 80, 8, 128),
    ModelShape("llama3-8b", 32, 8, 128),
    ModelShape("llama3-70b", 80, 8, 128),
    ModelShape("mistral-7b", 32, 8, 128),
    ModelShape("qwen2.5-7b", 28, 4, 128),
    ModelShape("qwen2.5-72b", 80, 8, 128),
    ModelShape("reference", 4, 2, 64, 4),        # kvstore's reference engine (fp32)
]}


@dataclass(frozen=True)
class Workload:
    request_rate: float = 1.0            # requests/s
    input_tokens: int = 2048             # prompt tokens per request
    output_tokens: int = 256

    @property
    def input_token_rate(self) -> float:
        return self.request_rate * self.input_tokens

    @property
    def output_token_rate(self) -> float:
        return self.request_rate * self.output_tokens


@dataclass(frozen=True)
class Throughput:
    prefill_tps: float                   # prompt tokens/s one prefill instance computes
    decode_tps: float                    # output tokens/s one decode instance generates (all streams)
    stream_tps: float                    # output tokens/s of one stream (sets TPOT)
    source: str = "given"


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    context_tokens: int
    memory_bytes: int
    workload: Workload
    throughput: Throughput

    @property
    def kv_bytes_per_request(self) -> int:
        return self.model.kv_bytes_per_token * self.context_tokens

    @property
    def requests_per_instance(self) -> int:
        return self.memory_bytes // self.kv_bytes_per_request

    @property
    def prefill_instances(self) -> int:
        return math.ceil(self.workload.input_token_rate / self.throughput.prefill_tps)

    @property
    def concurrent_decodes(self) -> float:
        return self.workload.request_rate * self.workload.output_tokens / self.throughput.stream_tps

    @property
    def decode_instances(self) -> int:
        by_rate = math.ceil(self.workload.output_token_rate / self.throughput.decode_tps)
        fit = self.requests_per_instance
        by_memory = math.ceil(self.concurrent_decodes / fit) if fit else math.inf
        return max(by_rate, by_memory)

    def to_dict(self) -> dict:
        return {**asdict(self), "kv_bytes_per_token": self.model.kv_bytes_per_token,
                "kv_bytes_per_request": self.kv_bytes_per_request,
                "requests_per_instance": self.requests_per_instance,
                "prefill_instances": self.prefill_instances, "decode_instances": self.decode_instances,
                "concurrent_decodes": self.concurrent_decodes}


def human_bytes(n: float) -> str:
    """In the largest unit that reads as at least 0.5 (a 7B model's token is "0.50 MiB")."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size / 2:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_plan(p: Plan) -> str:
    m, w, t = p.model, p.workload, p.throughput
    return "\n".join([
        f"model {m.name}: {m.layers} layers x {m.kv_heads} KV heads x {m.head_dim} head dim x {m.dtype_bytes} B",
        f"  KV per token      {human_bytes(m.kv_bytes_per_token)} ({m.kv_bytes_per_token} B)",
        f"  KV per request    {human_bytes(p.kv_bytes_per_request)} ({p.context_tokens} tokens)",
        f"  fit in {human_bytes(p.memory_bytes)}  {p.requests_per_instance} concurrent requests",
        f"workload: {w.request_rate:g} req/s x ({w.input_tokens} in + {w.output_tokens} out) tokens = "
        f"{w.input_token_rate:,.0f} input + {w.output_token_rate:,.0f} output tokens/s",
        f"throughput per instance ({t.source}): prefill {t.prefill_tps:,.0f} tok/s, decode "
        f"{t.decode_tps:,.0f} tok/s ({t.stream_tps:,.0f} per stream)",
        f"  prefill instances {p.prefill_instances}   (= ceil({w.input_token_rate:,.0f} / {t.prefill_tps:,.0f}))",
        f"  decode instances  {p.decode_instances}   (rate: ceil({w.output_token_rate:,.0f} / {t.decode_tps:,.0f}); "
        f"memory: {p.concurrent_decodes:.1f} streams at once, {p.requests_per_instance} fit each)",
    ])


def measure_reference(prompt_tokens: int = 1024, decode_steps: int = 32) -> Throughput:
    """Prefill and single-stream decode speed of the reference engine on this machine (it serves
    one request at a time, so an instance's decode rate is its stream rate)."""
    import torch

    from kvstore.engines.reference.model import ModelConfig, ReferenceModel
    from kvstore.engines.reference.paged_cache import CacheShape, PagedKVCache

    model = ReferenceModel(ModelConfig())
    c = model.config
    cache = PagedKVCache(CacheShape(c.num_layers, (prompt_tokens + decode_steps) // 16 + 2, 16,
                                    c.num_kv_heads, c.head_dim, c.torch_dtype))
    table = cache.allocate(cache.shape.num_blocks)
    prompt = torch.randint(0, c.vocab_size, (prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    model.forward(prompt[:64], 0, cache, table)               # warm-up
    start = time.perf_counter()
    model.forward(prompt, 0, cache, table)
    prefill_tps = prompt_tokens / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(decode_steps):
        model.forward([1], prompt_tokens + i, cache, table)
    stream_tps = decode_steps / (time.perf_counter() - start)
    return Throughput(prefill_tps, stream_tps, stream_tps, "measured on the reference engine")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=sorted(PRESETS), default="llama2-7b", help="a preset shape")
    p.add_argument("--layers", type=int, help="override: transformer layers")
    p.add_argument("--hidden", type=int, help="override: hidden size (with --heads gives head dim)")
    p.add_argument("--heads", type=int, help="override: attention heads")
    p.add_argument("--kv-heads", type=int, help="override: KV heads (default: --heads, i.e. MHA)")
    p.add_argument("--head-dim", type=int, help="override: head dimension")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), help="override: KV dtype")
    p.add_argument("--context", type=int, help="tokens of KV per request (default input + output)")
    p.add_argument("--memory", type=parse_size, default=parse_size("80GiB"),
                   help="KV memory of one decode instance, e.g. 40GiB")
    p.add_argument("--request-rate", type=float, default=Workload.request_rate)
    p.add_argument("--input-tokens", type=int, default=Workload.input_tokens)
    p.add_argument("--output-tokens", type=int, default=Workload.output_tokens)
    p.add_argument("--prefill-tps", type=float, default=10000.0, help="per prefill instance")
    p.add_argument("--decode-tps", type=float, default=2000.0, help="per decode instance, all streams")
    p.add_argument("--stream-tps", type=float, default=40.0, help="per decode stream (1 / TPOT)")
    p.add_argument("--measure", action="store_true", help="measure throughputs on the reference engine")
    p.add_argument("--json", action="store_true")


def shape_from_args(args: argparse.Namespace) -> ModelShape:
    base = PRESETS[args.model]
    head_dim = args.head_dim or (args.hidden // args.heads if args.hidden and args.heads else base.head_dim)
    kv_heads = args.kv_heads or args.heads or base.kv_heads
    custom = any(getattr(args, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "dtype"))
    return ModelShape(f"{base.name} (modified)" if custom else base.name, args.layers or base.layers, kv_heads,
                      head_dim, DTYPE_BYTES[args.dtype] if args.dtype else base.dtype_bytes)


def run(args: argparse.Namespace) -> int:
    workload = Workload(args.request_rate, args.input_tokens, args.output_tokens)
    throughput = measure_reference() if args.measure else Throughput(args.prefill_tps, args.decode_tps, args.stream_tps)
    plan = Plan(shape_from_args(args), args.context or workload.input_tokens + workload.output_tokens,
                args.memory, workload, throughput)
    print(json.dumps(plan.to_dict(), indent=2, default=str) if args.json else format_plan(plan))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvstore plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
