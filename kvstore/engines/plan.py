"""`kvstore plan`: size a PD deployment — prefill and decode instances, the links between them
and kvstore, and the store — for a model and a workload.

    kvstore plan --model llama2-7b --request-rate 20 --input-tokens 4096
    kvstore plan --config /path/to/model/config.json --gpu h100-80g --tp 2 --prefix-hit-rate 0.5

The model comes from a preset or a Hugging Face config.json; per-instance throughputs are given
(--prefill-tps, --decode-tps, --stream-tps), measured (--measure, on the reference engine) or else
estimated from the hardware (--gpu, --tp) under stated assumptions (--mfu, --bandwidth-utilization,
--tpot). Every formula and its source: docs/planning.md. An impossible plan (a request whose KV
does not fit, a throughput of 0, an unreadable config) prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from kvstore.engines.planner import PlanError
from kvstore.engines.planner.hardware import ACCELERATORS
from kvstore.engines.planner.hf_config import read_config, shape_from_config
from kvstore.engines.planner.model import ARCHITECTURES, DTYPE_BYTES, PRESETS, ModelShape
from kvstore.engines.planner.report import format_plan, human_bytes
from kvstore.engines.planner.sizing import Deployment, Plan, Throughput, Workload, estimate

__all__ = [
    "PRESETS",
    "ModelShape",
    "Plan",
    "PlanError",
    "Throughput",
    "Workload",
    "format_plan",
    "human_bytes",
    "main",
    "run",
]


def measure_reference(prompt_tokens: int = 1024, decode_steps: int = 32) -> Throughput:
    """Prefill and single-stream decode speed of the reference engine on this machine (it serves
    one request at a time, so an instance's decode rate is its stream rate)."""
    import torch

    from kvstore.engines.reference.model import ModelConfig, ReferenceModel
    from kvstore.engines.reference.paged_cache import CacheShape, PagedKVCache

    model = ReferenceModel(ModelConfig())
    c = model.config
    cache = PagedKVCache(
        CacheShape(
            c.num_layers, (prompt_tokens + decode_steps) // 16 + 2, 16, c.num_kv_heads, c.head_dim, c.torch_dtype
        )
    )
    table = cache.allocate(cache.shape.num_blocks)
    prompt = torch.randint(0, c.vocab_size, (prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    model.forward(prompt[:64], 0, cache, table)  # warm-up
    start = time.perf_counter()
    model.forward(prompt, 0, cache, table)
    prefill_tps = prompt_tokens / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(decode_steps):
        model.forward([1], prompt_tokens + i, cache, table)
    stream_tps = decode_steps / (time.perf_counter() - start)
    return Throughput(prefill_tps, stream_tps, stream_tps, "measured on the reference engine")


def _size(text: str) -> int:
    from kvstore.config import parse_size

    try:
        value = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 40GiB, 512MiB)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def _count(text: str) -> float:
    """'6.74B', '70e9', '700M' -> a number of parameters."""
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * scale[t[-1]] if t and t[-1] in scale else float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a parameter count (e.g. 6.74B, 70e9)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a parameter count must be positive")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model (a preset, or a Hugging Face config.json; flags override either)")
    m.add_argument(
        "--model",
        choices=sorted(PRESETS),
        default="llama2-7b",
        metavar="PRESET",
        help=f"one of {', '.join(sorted(PRESETS))} (default: %(default)s)",
    )
    m.add_argument("--config", metavar="PATH", help="a model's config.json, or its directory")
    m.add_argument("--layers", type=int, help="transformer layers")
    m.add_argument("--hidden", type=int, help="hidden size (with --heads gives the head dim)")
    m.add_argument("--heads", type=int, help="attention heads")
    m.add_argument("--kv-heads", type=int, help="KV heads (default --heads: MHA)")
    m.add_argument("--head-dim", type=int, help="head dimension")
    m.add_argument(
        "--dtype",
        choices=sorted(DTYPE_BYTES),
        metavar="DTYPE",
        help=f"KV cache dtype, one of {', '.join(sorted(DTYPE_BYTES))} (default: the model's)",
    )
    m.add_argument(
        "--weight-dtype", choices=sorted(DTYPE_BYTES), metavar="DTYPE", help="weights as served (default: the model's)"
    )
    m.add_argument("--params", type=_count, help="total parameters, e.g. 6.74B (weights memory)")
    m.add_argument(
        "--active-params",
        type=_count,
        help="parameters a token uses, without embeddings (MoE; FLOPs; default: derived or --params)",
    )
    w = p.add_argument_group("workload")
    w.add_argument(
        "--request-rate", type=float, default=Workload.request_rate, help="requests/s (default: %(default)s)"
    )
    w.add_argument(
        "--input-tokens", type=int, default=Workload.input_tokens, help="prompt tokens (default: %(default)s)"
    )
    w.add_argument("--output-tokens", type=int, default=Workload.output_tokens, help="default: %(default)s")
    w.add_argument(
        "--prefix-hit-rate",
        type=float,
        default=0.0,
        help="share of prompt tokens whose KV kvstore already holds (default: %(default)s)",
    )
    w.add_argument("--context", type=int, help="tokens of KV per request (default: input + output)")
    h = p.add_argument_group("one instance (prefill or decode)")
    h.add_argument(
        "--gpu",
        choices=sorted(ACCELERATORS),
        default="h100-80g",
        metavar="GPU",
        help=f"one of {', '.join(sorted(ACCELERATORS))} (default: %(default)s)",
    )
    h.add_argument("--tp", type=int, default=1, help="GPUs per instance, tensor parallel (default: %(default)s)")
    h.add_argument("--gpu-memory", type=_size, help="override: memory of one GPU, e.g. 80GiB")
    h.add_argument("--gpu-tflops", type=float, help="override: dense 16-bit TFLOP/s of one GPU")
    h.add_argument("--gpu-bandwidth", type=float, help="override: memory bandwidth of one GPU, TB/s")
    h.add_argument(
        "--memory-utilization",
        type=float,
        default=Deployment.memory_utilization,
        help="share of GPU memory the engine takes, weights and KV (default: %(default)s)",
    )
    h.add_argument(
        "--kv-memory",
        "--memory",
        dest="kv_memory",
        type=_size,
        help="the KV cache of one decode instance, if known (default: usable memory - weights)",
    )
    a = p.add_argument_group("throughput per instance (default: estimated from the hardware)")
    a.add_argument("--prefill-tps", type=float, help="prompt tokens/s of one prefill instance")
    a.add_argument("--decode-tps", type=float, help="output tokens/s of one decode instance, all streams")
    a.add_argument("--stream-tps", type=float, help="output tokens/s of one stream (1 / TPOT)")
    a.add_argument("--measure", action="store_true", help="measure throughputs on the reference engine")
    a.add_argument(
        "--mfu",
        type=float,
        default=Deployment.mfu,
        help="estimate: share of peak FLOP/s a prefill achieves (default: %(default)s)",
    )
    a.add_argument(
        "--bandwidth-utilization",
        type=float,
        default=Deployment.bandwidth_utilization,
        help="estimate: share of peak memory bandwidth a decode step achieves (default: %(default)s)",
    )
    a.add_argument(
        "--tpot",
        type=float,
        default=Deployment.tpot_s,
        help="decode target, seconds per output token (default: %(default)s)",
    )
    a.add_argument("--ttft", type=float, default=Deployment.ttft_s, help="TTFT target, seconds (default: %(default)s)")
    n = p.add_argument_group("network and store")
    n.add_argument(
        "--link-gbps",
        type=float,
        default=Deployment.link_bytes_per_s * 8 / 1e9,
        help="network of one instance, Gbit/s (default: %(default)g)",
    )
    n.add_argument(
        "--retention",
        type=float,
        default=Deployment.retention_s,
        help="seconds the store keeps KV for reuse (default: %(default)g)",
    )
    p.add_argument("--json", action="store_true")
    from kvstore.engines import plan_measure

    plan_measure.add_arguments(p)


def model_from_args(args: argparse.Namespace) -> ModelShape:
    """The preset or config.json, with the flags' overrides."""
    dims = {
        k: getattr(args, k)
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim")
        if getattr(args, k) is not None
    }
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in dims.items() if v <= 0]
    if bad:
        raise PlanError(f"model dimensions must be positive: {', '.join(bad)}")
    if args.config:
        shape = shape_from_config(read_config(args.config), args.config)
        if dims:
            shape = _reshaped(shape, dims)
    else:
        shape = _rederived(args.model, dims) if dims else PRESETS[args.model]
    changes: dict[str, Any] = {}
    if args.dtype:
        changes["dtype_bytes"] = DTYPE_BYTES[args.dtype]
    if args.weight_dtype:
        changes["weight_bytes"] = DTYPE_BYTES[args.weight_dtype]
    if args.params:
        changes["params"] = args.params
        changes["compute_params"] = args.active_params or shape.compute_params or args.params
    elif args.active_params:
        changes["compute_params"] = args.active_params
    return dataclasses.replace(shape, **changes) if changes else shape


def _rederived(preset: str, dims: dict[str, int]) -> ModelShape:
    """A preset with other dimensions; its parameter count follows them."""
    arch = ARCHITECTURES[preset]
    heads, hidden = dims.get("heads", arch.heads), dims.get("hidden", arch.hidden)
    kv_heads = dims.get("kv_heads") or (heads if "heads" in dims else arch.kv_heads)  # --heads alone: MHA
    arch = dataclasses.replace(
        arch,
        layers=dims.get("layers", arch.layers),
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=dims.get("head_dim") or hidden // heads,
    )
    base = PRESETS[preset]
    return arch.shape(f"{preset} (modified)", base.dtype_bytes, base.weight_bytes)


def _reshaped(shape: ModelShape, dims: dict[str, int]) -> ModelShape:
    """A config's model with another KV shape: its parameter count no longer applies (--params)."""
    heads = dims.get("heads")
    head_dim = dims.get("head_dim") or (dims["hidden"] // heads if heads and "hidden" in dims else shape.head_dim)
    kv_changed = any(k in dims for k in ("heads", "kv_heads", "head_dim", "hidden"))
    return dataclasses.replace(
        shape,
        name=f"{shape.name} (modified)",
        layers=dims.get("layers", shape.layers),
        kv_heads=dims.get("kv_heads") or heads or shape.kv_heads,
        head_dim=head_dim,
        attn_dim=heads * head_dim if heads else shape.attn_dim,
        latent_dim=None if kv_changed else shape.latent_dim,
        params=None,
        compute_params=None,
    )


def throughput_from_args(
    args: argparse.Namespace, model: ModelShape, workload: Workload, dep: Deployment, context: int
) -> Throughput:
    given = (args.prefill_tps, args.decode_tps, args.stream_tps)
    if all(v is not None for v in given):
        return Throughput(*given, "given")
    est = estimate(model, workload, dep, context)
    if all(v is None for v in given):
        return est
    return Throughput(
        args.prefill_tps if args.prefill_tps is not None else est.prefill_tps,
        args.decode_tps if args.decode_tps is not None else est.decode_tps,
        args.stream_tps if args.stream_tps is not None else est.stream_tps,
        "given and estimated",
        "" if args.prefill_tps is not None else est.prefill_how,
        "" if args.decode_tps is not None and args.stream_tps is not None else est.decode_how,
    )


def build_plan(args: argparse.Namespace) -> Plan:
    """Raises PlanError (one line) when no plan can be made from these inputs."""
    model = model_from_args(args)
    workload = Workload(args.request_rate, args.input_tokens, args.output_tokens, args.prefix_hit_rate)
    context = args.context if args.context is not None else workload.input_tokens + workload.output_tokens
    gpu = ACCELERATORS[args.gpu].overridden(
        args.gpu_memory, args.gpu_tflops and args.gpu_tflops * 1e12, args.gpu_bandwidth and args.gpu_bandwidth * 1e12
    )
    dep = Deployment(
        gpu,
        args.tp,
        args.memory_utilization,
        args.kv_memory,
        args.mfu,
        args.bandwidth_utilization,
        args.tpot,
        args.ttft,
        args.link_gbps * 1e9 / 8,
        args.retention,
    )
    throughput = measure_reference() if args.measure else throughput_from_args(args, model, workload, dep, context)
    return Plan(model, workload, dep, throughput, context)


def run(args: argparse.Namespace) -> int:
    if args.measure:  # measured throughputs and SLO headroom: plan_measure.py
        from kvstore.engines import plan_measure

        return plan_measure.run(args, model_from_args(args))
    try:
        plan = build_plan(args)
    except PlanError as exc:
        print(f"kvstore plan: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2, default=str) if args.json else format_plan(plan))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="kvstore plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
