"""Decode-side TTFT with the prompt's KV loaded from kvstore vs recomputed, on vLLM's CPU build.

    .venv/bin/python -m tests.vllm.bench_ttft --model tiny          # 2-layer toy Llama, fp32
    .venv/bin/python -m tests.vllm.bench_ttft --model 1b --dtype bfloat16

A prefill instance (kv_producer) computes each prompt once (max_tokens=1) and exits; a decode
instance (kv_consumer, vLLM's prefix cache off so every run goes to kvstore) then serves
max_tokens=1 requests: the stored prompts load their KV, prompts never stored are recomputed.
Models are made offline with seeded random weights (compute cost is what matters here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.cluster import Cluster
from tests.vllm.harness import Instance, kv_config
from tests.vllm.tiny_model import build_tiny_llama, prompt_ids

MODELS = {  # name: (layers, hidden, heads, kv_heads, intermediate)
    "tiny": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2},
    # TinyLlama-1.1B's body (22 -> 16 layers, 32K -> 512 vocab): ~0.8B parameters
    "1b": {"layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 4},
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--load-async", choices=["true", "false"], default="true")
    p.add_argument("--granularity", choices=["layer", "block"], default="layer")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--dir", default=None, help="where to build the model (default: a temp dir)")
    args = p.parse_args()

    root = Path(args.dir or tempfile.mkdtemp(prefix="kvstore-bench-"))
    shape = MODELS[args.model]
    model = str(
        build_tiny_llama(
            root / f"llama-{args.model}",
            max_positions=args.tokens + 512,
            **shape,
            **({"intermediate": 5632} if args.model == "1b" else {}),
        )
    )
    stored = [prompt_ids(args.tokens, 100 + i) for i in range(args.runs)]
    fresh = [prompt_ids(args.tokens, 200 + i) for i in range(args.runs)]
    settings = {
        "model": model,
        "dtype": args.dtype,
        "block_size": args.block_size,
        "max_model_len": args.tokens + 256,
        "max_num_batched_tokens": args.tokens + 256,
        "kv_cache_bytes": 4 * args.tokens * _kv_bytes_per_token(shape, args.dtype) + (64 << 20),
    }
    env = {"OMP_NUM_THREADS": str(args.threads)}
    cluster = Cluster()
    try:
        _, meta = cluster.meta()
        cluster.daemon(meta, "2GiB")
        prefill = Instance(
            "prefill", {**settings, "kv_transfer_config": kv_config("kv_producer", meta)}, timeout=900, env=env
        )
        pre = prefill.generate(stored, 1, timeout=1800)
        prefill.close()
        decode = Instance(
            "decode",
            {
                **settings,
                "prefix_caching": False,
                "kv_transfer_config": kv_config(
                    "kv_consumer", meta, load_async=args.load_async == "true", granularity=args.granularity
                ),
            },
            timeout=900,
            env=env,
        )
        decode.generate([prompt_ids(64, 7)], 1)  # warm-up
        loaded, recomputed, load_s, load_bytes = [], [], [], 0
        for ids_stored, ids_fresh in zip(stored, fresh):
            before = decode.call(op="stats")["worker"]
            out = decode.generate([ids_stored], 1, timeout=900)
            after = out["stats"]["worker"]
            assert after["load_failures"] == before["load_failures"], "a load failed"
            loaded.append(out["seconds"][0])
            load_s.append(after["load_s"] - before["load_s"])
            load_bytes = after["load_bytes"] - before["load_bytes"]
            recomputed.append(decode.generate([ids_fresh], 1, timeout=900)["seconds"][0])
        decode.close()
    finally:
        cluster.close()
    med = statistics.median
    result = {
        "model": args.model,
        "dtype": args.dtype,
        "prompt_tokens": args.tokens,
        "block_size": args.block_size,
        "load_async": args.load_async,
        "granularity": args.granularity,
        "threads": args.threads,
        "prefill_s": [round(s, 3) for s in pre["seconds"]],
        "ttft_kvstore_s": round(med(loaded), 4),
        "ttft_recompute_s": round(med(recomputed), 4),
        "kv_load_s": round(med(load_s), 4),
        "kv_load_share": round(med(load_s) / med(loaded), 3),
        "kv_bytes": load_bytes,
        "load_GBps": round(load_bytes / med(load_s) / 1e9, 2),
        "speedup": round(med(recomputed) / med(loaded), 1),
        "runs": {"kvstore": [round(s, 4) for s in loaded], "recompute": [round(s, 4) for s in recomputed]},
    }
    print(json.dumps(result, indent=1))
    return 0


def _kv_bytes_per_token(shape: dict[str, Any], dtype: str) -> int:
    head = shape["hidden"] // shape["heads"]
    return shape["layers"] * 2 * shape["kv_heads"] * head * (4 if dtype == "float32" else 2)


if __name__ == "__main__":
    raise SystemExit(main())
