"""One vLLM instance (CPU build, in-process mode) driven over stdin/stdout by the tests and the
benchmark: `python -m tests.vllm.instance '<json settings>'`.

Prints `kvstore ready: instance pid=N` once the engine is up, then answers each JSON command line
with one `RESULT {json}` line:

    {"op": "generate", "prompts": [[ids...]], "max_tokens": 16}  -> tokens, seconds, kv_transfer_params,
                                                                    cached_tokens (prompt tokens vLLM did not
                                                                    compute: its prefix cache + connector)
        ("batch": true: all prompts in one generate call, in flight together; one shared time)
    {"op": "stats"}                                              -> the connector's counters
    {"op": "exit"}
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from kvstore.logs import say_ready


def build_llm(settings: dict[str, Any]):
    from vllm import LLM
    from vllm.config import KVTransferConfig

    kv = settings.get("kv_transfer_config")
    if kv and kv.get("kv_connector_module_path") == "kvstore.engines.vllm":
        # kvstore's connector as tests/vllm/probe.py subclasses it: the same connector, whose live
        # instances connector_stats() can read.
        kv = {**kv, "kv_connector_module_path": "tests.vllm.probe"}
    return LLM(
        model=settings["model"],
        dtype=settings.get("dtype", "float32"),
        block_size=settings.get("block_size", 32),
        max_model_len=settings.get("max_model_len", 4096),
        max_num_batched_tokens=settings.get("max_num_batched_tokens", 4096),
        distributed_executor_backend="uni",
        enforce_eager=True,
        seed=0,
        kv_cache_memory_bytes=settings.get("kv_cache_bytes", 64 << 20),
        enable_prefix_caching=settings.get("prefix_caching", True),
        kv_transfer_config=KVTransferConfig(**kv) if kv else None,
    )


def connector_stats() -> dict[str, Any]:
    try:
        from tests.vllm.probe import LIVE
    except ImportError:
        return {}
    out: dict[str, Any] = {}
    if "worker" in LIVE:
        worker = LIVE["worker"].worker
        assert worker is not None
        out["worker"] = dict(worker.totals.data)
    if "scheduler" in LIVE:
        sched = LIVE["scheduler"].scheduler
        assert sched is not None
        out["scheduler"] = dict(sched.stats)
        out["namespace"] = sched.scheme.namespace if sched.scheme else None
        out["parts"] = sched.parts
    return out


def generate(llm, cmd: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(
        max_tokens=cmd.get("max_tokens", 16),
        temperature=0.0,
        ignore_eos=True,
        extra_args={"kv_transfer_params": cmd["kv_transfer_params"]} if cmd.get("kv_transfer_params") else None,
    )
    tokens, seconds, kv_params, cached = [], [], [], []
    if cmd.get("batch"):  # in flight together: the scheduler batches them in its steps
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in cmd["prompts"]], params, use_tqdm=False)
        wall = time.perf_counter() - start
        return {
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "seconds": [wall] * len(outs),
            "kv_transfer_params": [o.kv_transfer_params for o in outs],
            "cached_tokens": [o.num_cached_tokens for o in outs],
            "stats": connector_stats(),
        }
    for ids in cmd["prompts"]:  # one at a time: each is timed on its own
        start = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        seconds.append(time.perf_counter() - start)
        tokens.append(list(out.outputs[0].token_ids))
        kv_params.append(out.kv_transfer_params)
        cached.append(out.num_cached_tokens)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "kv_transfer_params": kv_params,
        "cached_tokens": cached,
        "stats": connector_stats(),
    }


def main() -> int:
    settings = json.loads(sys.argv[1])
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    llm = build_llm(settings)
    say_ready(f"instance pid={os.getpid()}")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        result = generate(llm, cmd) if cmd["op"] == "generate" else connector_stats()
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
