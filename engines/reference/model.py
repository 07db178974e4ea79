"""A small Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU; seeded weights.

It exists to check end to end that KV moved through kvstore is the KV a local prefill makes, so
it is written for determinism, not speed: fp32, one attention code path for a prompt chunk and a
decode step (a step is a chunk of one token), attention always over the paged cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from kvstore.engines.reference.paged_cache import PagedKVCache

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
           "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    name: str = "kvstore-reference-tiny"
    vocab_size: int = 512
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 688
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_positions: int = 8192
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")

    @property
    def fingerprint(self) -> str:
        """Short digest of every field: the weights, hence the KV, are a function of these alone."""
        return hashlib.blake2b(repr(dataclasses.astuple(self)).encode(), digest_size=4).hexdigest()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.torch_dtype.itemsize


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ReferenceModel:
    """Weights are a function of the config alone (torch.Generator seeded with config.seed)."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = c = config
        gen = torch.Generator().manual_seed(c.seed)
        dt = c.torch_dtype

        def normal(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).to(dt)

        kv_dim = c.num_kv_heads * c.head_dim
        self.embed = normal(c.vocab_size, c.hidden_size, std=1.0)
        self.layers = []
        for _ in range(c.num_layers):
            self.layers.append({
                "attn_norm": torch.ones(c.hidden_size, dtype=dt),
                "wq": normal(c.hidden_size, c.hidden_size, std=c.hidden_size ** -0.5),
                "wk": normal(c.hidden_size, kv_dim, std=c.hidden_size ** -0.5),
                "wv": normal(c.hidden_size, kv_dim, std=c.hidden_size ** -0.5),
                "wo": normal(c.hidden_size, c.hidden_size, std=c.hidden_size ** -0.5),
                "mlp_norm": torch.ones(c.hidden_size, dtype=dt),
                "w_gate": normal(c.hidden_size, c.intermediate_size, std=c.hidden_size ** -0.5),
                "w_up": normal(c.hidden_size, c.intermediate_size, std=c.hidden_size ** -0.5),
                "w_down": normal(c.intermediate_size, c.hidden_size, std=c.intermediate_size ** -0.5),
            })
        self.final_norm = torch.ones(c.hidden_size, dtype=dt)
        self.lm_head = normal(c.hidden_size, c.vocab_size, std=c.hidden_size ** -0.5)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        angles = torch.outer(torch.arange(c.max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self._cos, self._sin = angles.cos().to(dt), angles.sin().to(dt)

    @torch.inference_mode()
    def forward(self, tokens: Sequence[int], start: int, cache: PagedKVCache, table: Sequence[int],
                on_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Run positions [start, start+len(tokens)) of a sequence whose earlier KV is already in
        `cache` under block `table`; writes this chunk's KV there. `on_layer(l)` is called once
        layer l's KV for the chunk is in the cache (a save of that layer may begin). Returns the
        logits of the chunk's last position."""
        c = self.config
        m = len(tokens)
        end = start + m
        if end > c.max_positions:
            raise ValueError(f"sequence of {end} tokens is over max_positions {c.max_positions}")
        cos, sin = self._cos[start:end, None, :], self._sin[start:end, None, :]
        group = c.num_heads // c.num_kv_heads
        key_pos = torch.arange(end)
        query_pos = torch.arange(start, end)
        masked = (key_pos[None, :] > query_pos[:, None])           # [m, end]: causal
        x = self.embed[torch.as_tensor(list(tokens), dtype=torch.long)]
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w["attn_norm"], c.rms_eps)
            q = (h @ w["wq"]).view(m, c.num_heads, c.head_dim)
            k = (h @ w["wk"]).view(m, c.num_kv_heads, c.head_dim)
            v = (h @ w["wv"]).view(m, c.num_kv_heads, c.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.write(i, table, start, k, v)
            if on_layer is not None:
                on_layer(i)
            keys, values = cache.read(i, table, end)                # [end, kv_heads, dim]
            qg = q.view(m, c.num_kv_heads, group, c.head_dim).permute(1, 2, 0, 3)
            scores = (qg @ keys.permute(1, 2, 0).unsqueeze(1)) / math.sqrt(c.head_dim)
            probs = scores.masked_fill(masked, float("-inf")).softmax(dim=-1)
            attn = (probs @ values.permute(1, 0, 2).unsqueeze(1)).permute(2, 0, 1, 3).reshape(m, c.hidden_size)
            x = x + attn @ w["wo"]
            h = _rms_norm(x, w["mlp_norm"], c.rms_eps)
            x = x + (torch.nn.functional.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
        return _rms_norm(x[-1], self.final_norm, c.rms_eps) @ self.lm_head
