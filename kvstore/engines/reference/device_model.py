"""The reference model's weights on a device, with a forward pass built for speed: one pass over a
whole prompt, torch's fused scaled-dot-product attention (flash / memory-efficient kernels on
CUDA), KV written to and read from the same paged layout the reference engine and the codec use.

ReferenceModel is written for bit-exact determinism on the CPU and materializes every attention
score, which a 32K-token prompt cannot afford; this one is what TTFT is measured with at real model
sizes (benchmarks/engines/ttft.py). It takes the very weights of ReferenceModel(config) (seeded on the CPU,
then moved), so the KV it makes is the model's; its numbers are not bit-identical to
ReferenceModel.forward (other kernels, other rounding), only to themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from kvstore.engines.reference.model import ModelConfig, ReferenceModel


def llama_1b(max_positions: int = 34816) -> ModelConfig:
    """A ~1.1B-parameter Llama-style shape (Llama 3.2 1B's depth and widths, a 32K vocabulary,
    separate embedding and head), bf16; weights seeded like every ReferenceModel's."""
    return ModelConfig(
        name="llama-1b-like",
        vocab_size=32000,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        intermediate_size=8192,
        rope_theta=500000.0,
        max_positions=max_positions,
        dtype="bfloat16",
    )


def parameter_count(c: ModelConfig) -> int:
    kv = c.num_kv_heads * c.head_dim
    per_layer = 2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size
    return 2 * c.vocab_size * c.hidden_size + c.num_layers * (per_layer + 2 * c.hidden_size) + c.hidden_size


def new_planes(c: ModelConfig, num_blocks: int, block_size: int, device: torch.device) -> list[torch.Tensor]:
    """A paged KV cache: per layer `[num_blocks, 2, block_size, kv_heads, head_dim]` (K then V per
    block), as PagedKVCache lays it out, on `device`."""
    return [
        torch.zeros(num_blocks, 2, block_size, c.num_kv_heads, c.head_dim, dtype=c.torch_dtype, device=device)
        for _ in range(c.num_layers)
    ]


class DeviceModel:
    def __init__(self, model: ReferenceModel, device: torch.device) -> None:
        self.config = c = model.config
        self.device = device
        self.embed = model.embed.to(device)
        self.layers = [{name: w.to(device) for name, w in layer.items()} for layer in model.layers]
        self.final_norm = model.final_norm.to(device)
        self.lm_head = model.lm_head.to(device)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        angles = torch.outer(torch.arange(c.max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self._cos = angles.cos().to(c.torch_dtype).to(device)
        self._sin = angles.sin().to(c.torch_dtype).to(device)

    @torch.inference_mode()
    def forward(
        self, tokens: Sequence[int], start: int, planes: Sequence[torch.Tensor], table: Sequence[int]
    ) -> torch.Tensor:
        """Positions [start, start+len(tokens)) of a sequence whose KV for [0, start) is in `planes`
        under block `table`; writes this chunk's KV there and returns the last position's logits."""
        c = self.config
        m, end = len(tokens), start + len(tokens)
        if end > c.max_positions:
            raise ValueError(f"sequence of {end} tokens is over max_positions {c.max_positions}")
        bs = planes[0].shape[2]
        blocks = torch.as_tensor(list(table[: -(-end // bs)]), dtype=torch.long, device=self.device)
        pos = torch.arange(start, end, device=self.device)
        slot_block, slot = blocks[pos // bs], pos % bs
        cos, sin = self._cos[start:end, None, :], self._sin[start:end, None, :]
        # A whole prompt is plain causal attention; a tail after cached KV sees every earlier key.
        mask = None if start == 0 else (torch.arange(end, device=self.device)[None, :] <= pos[:, None])
        group = c.num_heads // c.num_kv_heads
        x = self.embed[torch.as_tensor(list(tokens), dtype=torch.long, device=self.device)]
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w["attn_norm"], c.rms_eps)
            q = (h @ w["wq"]).view(m, c.num_heads, c.head_dim)
            k = (h @ w["wk"]).view(m, c.num_kv_heads, c.head_dim)
            v = (h @ w["wv"]).view(m, c.num_kv_heads, c.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            planes[i][slot_block, 0, slot] = k
            planes[i][slot_block, 1, slot] = v
            kv = planes[i][blocks]  # [n, 2, bs, kv_heads, dim]
            keys = kv[:, 0].reshape(-1, c.num_kv_heads, c.head_dim)[:end]
            values = kv[:, 1].reshape(-1, c.num_kv_heads, c.head_dim)[:end]
            keys = keys.permute(1, 0, 2).repeat_interleave(group, dim=0)  # [heads, end, dim]
            values = values.permute(1, 0, 2).repeat_interleave(group, dim=0)
            attn = F.scaled_dot_product_attention(
                q.permute(1, 0, 2)[None],
                keys[None],
                values[None],
                attn_mask=mask,
                is_causal=mask is None,
                scale=1.0 / math.sqrt(c.head_dim),
            )
            x = x + attn[0].permute(1, 0, 2).reshape(m, c.hidden_size) @ w["wo"]
            h = _rms_norm(x, w["mlp_norm"], c.rms_eps)
            x = x + (F.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]
        return _rms_norm(x[-1], self.final_norm, c.rms_eps) @ self.lm_head


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
