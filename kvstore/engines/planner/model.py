"""What the planner needs of a model: KV bytes per token, and parameter counts for weight memory
and compute.

    KV bytes per token = layers x 2 (K and V) x kv_heads x head_dim x dtype bytes
                       = layers x latent_dim x dtype bytes        (MLA: one latent vector a token)

Parameter counts are derived from the architecture (`dense_params`, `moe_params`), so the presets
carry the shapes of their configs, not copied totals; tests check them against published counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.engines.planner import PlanError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # of the KV cache
    latent_dim: int | None = None  # MLA: K and V share one vector of this many values
    attn_dim: int | None = None  # query heads x head_dim (attention FLOPs)
    params: float | None = None  # all weights (memory); None: unknown
    compute_params: float | None = None  # active per token, without embeddings (FLOPs)
    weight_bytes: int = 2  # bytes per parameter as served
    sliding_window: int | None = None  # tokens a layer attends to, if windowed

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim, self.dtype_bytes, self.weight_bytes) <= 0:
            raise PlanError(f"{self.name}: layers, KV heads, head dim and dtype bytes must be positive")
        if self.latent_dim is not None and self.latent_dim <= 0:
            raise PlanError(f"{self.name}: the MLA latent dimension must be positive")

    @property
    def kv_bytes_per_token(self) -> int:
        per_layer = self.latent_dim if self.latent_dim else 2 * self.kv_heads * self.head_dim
        return self.layers * per_layer * self.dtype_bytes

    @property
    def weights_bytes(self) -> float | None:
        return None if self.params is None else self.params * self.weight_bytes

    def flops_per_prompt_token(self, prompt_tokens: int) -> float | None:
        """Forward FLOPs per token of a prompt of `prompt_tokens` (Kaplan et al. 2020, table 1):
        2 x non-embedding params + 2 x layers x context x attention width, context = the prompt."""
        if self.compute_params is None:
            return None
        attn = self.attn_dim or self.kv_heads * self.head_dim
        return 2 * self.compute_params + 2 * self.layers * prompt_tokens * attn

    def describe(self) -> str:
        kv = (
            f"MLA latent {self.latent_dim}"
            if self.latent_dim
            else f"{self.kv_heads} KV heads x {self.head_dim} head dim"
        )
        return f"{self.layers} layers x {kv} x {self.dtype_bytes} B"


@dataclass(frozen=True)
class Architecture:
    """The fields of a transformer config that decide its parameter count."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied_embeddings: bool = False
    attention_bias: bool = False  # q/k/v biases (Qwen2)
    experts: int = 1  # MoE: experts per layer, and experts each token uses
    experts_per_token: int = 1

    def _attention(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = q + 2 * kv if self.attention_bias else 0
        return self.hidden * q + 2 * self.hidden * kv + q * self.hidden + bias

    def _layer(self, experts: int) -> int:
        mlp = 3 * self.hidden * self.intermediate  # gated MLP: gate, up, down
        router = self.hidden * self.experts if self.experts > 1 else 0
        return self._attention() + experts * mlp + router + 2 * self.hidden  # two RMSNorms

    @property
    def params(self) -> int:
        embed = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embed + self.layers * self._layer(self.experts) + self.hidden  # final norm

    @property
    def compute_params(self) -> int:
        """Active per token, embedding and unembedding left out (prefill computes logits for one
        token of the prompt)."""
        return self.layers * self._layer(self.experts_per_token)

    def shape(
        self, name: str, dtype_bytes: int = 2, weight_bytes: int = 2, sliding_window: int | None = None
    ) -> ModelShape:
        return ModelShape(
            name,
            self.layers,
            self.kv_heads,
            self.head_dim,
            dtype_bytes,
            attn_dim=self.heads * self.head_dim,
            params=self.params,
            compute_params=self.compute_params,
            weight_bytes=weight_bytes,
            sliding_window=sliding_window,
        )


def _llama(
    vocab: int,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    *,
    attention_bias: bool = False,
    experts: int = 1,
    experts_per_token: int = 1,
) -> Architecture:
    return Architecture(
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        hidden // heads,
        intermediate,
        attention_bias=attention_bias,
        experts=experts,
        experts_per_token=experts_per_token,
    )


# The shapes in each model's config.json on the Hugging Face Hub.
ARCHITECTURES = {
    "llama2-7b": _llama(32000, 4096, 32, 32, 32, 11008),
    "llama2-13b": _llama(32000, 5120, 40, 40, 40, 13824),
    "llama2-70b": _llama(32000, 8192, 80, 64, 8, 28672),
    "llama3-8b": _llama(128256, 4096, 32, 32, 8, 14336),
    "llama3-70b": _llama(128256, 8192, 80, 64, 8, 28672),
    "mistral-7b": _llama(32768, 4096, 32, 32, 8, 14336),  # v0.3
    "mixtral-8x7b": _llama(32000, 4096, 32, 32, 8, 14336, experts=8, experts_per_token=2),
    "qwen2.5-7b": _llama(152064, 3584, 28, 28, 4, 18944, attention_bias=True),
    "qwen2.5-72b": _llama(152064, 8192, 80, 64, 8, 29568, attention_bias=True),
    "reference": _llama(512, 256, 4, 4, 2, 688),  # kvstore's reference engine
}

PRESETS = {
    name: arch.shape(name, **({"dtype_bytes": 4, "weight_bytes": 4} if name == "reference" else {}))
    for name, arch in ARCHITECTURES.items()
}
