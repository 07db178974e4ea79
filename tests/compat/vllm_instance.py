"""A vLLM instance for the compatibility tests: tests/vllm/instance.py's engine (CPU build,
in-process mode), answering each prompt with its tokens and `num_cached_tokens` (local prefix
cache plus what a KV connector loaded). Run it under the mooncake.store alias to give vLLM's own
MooncakeStoreConnector a kvstore:

    python -m kvstore.compat.mooncake.run -m tests.compat.vllm_instance '<settings json>'

Prints `kvstore ready: instance pid=N`, then one `RESULT {json}` line per JSON command line
({"op": "generate", "prompts": [[ids]], "max_tokens": N} or {"op": "exit"}).
"""

from __future__ import annotations

import json
import os
import sys

from kvstore.logs import say_ready


def main() -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from tests.vllm.instance import build_llm

    llm = build_llm(json.loads(sys.argv[1]))
    import mooncake.store

    say_ready(f"instance pid={os.getpid()} store={mooncake.store.MooncakeDistributedStore.__module__}")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        params = SamplingParams(max_tokens=cmd.get("max_tokens", 8), temperature=0.0, ignore_eos=True)
        tokens, cached = [], []
        for ids in cmd["prompts"]:
            out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
            tokens.append(list(out.outputs[0].token_ids))
            cached.append(out.num_cached_tokens)
        print("RESULT " + json.dumps({"tokens": tokens, "cached": cached}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
