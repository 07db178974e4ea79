"""Prefill GPU time of a request, from `kvstore plan`'s formulas (kvstore/engines/planner/).

The planner's estimate (planner.sizing.estimate) takes prefill as compute-bound: a prompt token
costs ModelShape.flops_per_prompt_token(n) FLOPs (2 x active params + 2 x layers x n x attention
width, n = the prompt's length) at Deployment.flops (peak x GPUs x MFU). A prefill that loads `c`
cached tokens computes the other n - c:

    prefill_s(n, c) = (n - c) x flops_per_prompt_token(n) / Deployment.flops

(an upper bound on the attention term, which the planner takes at the whole prompt's length).
Loading a cached token instead costs kv_bytes_per_token / link_bytes_per_s; their ratio is the
router's load weight w (kvstore/engines/router/affinity.py: what loading a token costs against
computing one).

The default is the paper's setting: LLaMA3-70B (320 KB of KV a token, FAST'25 section 5.3.1) on
one node of 8 x A100-80G (the A800's compute), at the planner's default MFU and link speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.engines.planner.hardware import ACCELERATORS
from kvstore.engines.planner.model import PRESETS, ModelShape
from kvstore.engines.planner.sizing import Deployment


@dataclass(frozen=True)
class PrefillCost:
    model: ModelShape = field(default_factory=lambda: PRESETS["llama3-70b"])
    deployment: Deployment = field(default_factory=lambda: Deployment(ACCELERATORS["a100-80g"], gpus=8))

    def __post_init__(self) -> None:
        if self.model.flops_per_prompt_token(1) is None:
            raise ValueError(f"{self.model.name}: no parameter count, so no prefill FLOPs")

    def _flops_per_token(self, prompt_tokens: int) -> float:
        flops = self.model.flops_per_prompt_token(prompt_tokens)
        assert flops is not None  # checked in __post_init__
        return flops

    def seconds(self, prompt_tokens: int, cached_tokens: int = 0) -> float:
        """Prefill time of a prompt whose first `cached_tokens` are loaded, not computed."""
        computed = max(0, prompt_tokens - min(cached_tokens, prompt_tokens))
        return computed * self._flops_per_token(prompt_tokens) / self.deployment.flops

    def tokens_per_s(self, prompt_tokens: int) -> float:
        """Prompt tokens/s one node computes at this prompt length (planner's prefill_tps)."""
        return self.deployment.flops / self._flops_per_token(prompt_tokens)

    def load_weight(self, prompt_tokens: int) -> float:
        """Loading a token over the node's link, in units of computing one."""
        load_s = self.model.kv_bytes_per_token / self.deployment.link_bytes_per_s
        return load_s * self.tokens_per_s(prompt_tokens)

    def describe(self) -> str:
        d = self.deployment
        return (
            f"prefill_s(n, c) = (n - c) x FLOPs/token(n) / ({d.accelerator.flops / 1e12:.0f} TFLOP/s x {d.gpus} GPU "
            f"x {d.mfu:g} MFU); {self.model.name}, {self.model.kv_bytes_per_token} B KV/token, "
            f"link {d.link_bytes_per_s * 8 / 1e9:g} Gbit/s (kvstore plan's estimate)"
        )
