"""A ModelShape from a Hugging Face `config.json` (`kvstore plan --config PATH`).

Read: num_hidden_layers, num_attention_heads, num_key_value_heads (absent: = heads, MHA),
head_dim (absent: hidden_size / num_attention_heads), torch_dtype (or dtype), and for parameter
counts vocab_size, intermediate_size, tie_word_embeddings, attention_bias, num_local_experts /
num_experts_per_tok. A multimodal config's `text_config` is read in its place.

MLA models (DeepSeek-V2/V3: `kv_lora_rank`) cache one latent vector of kv_lora_rank +
qk_rope_head_dim values a token and layer, as vLLM does; their parameter count is not derived
(give --params). Refused, with the reason: configs without the fields above, and layers that do
not keep every token's K and V (state-space / linear-attention layers, per-layer sliding windows
beyond the planned context), whose KV a per-token figure cannot describe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvstore.engines.planner import PlanError
from kvstore.engines.planner.model import Architecture, ModelShape

_DTYPES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
# Keys that mark layers without a per-token KV cache (Mamba, Jamba, RWKV, linear attention, ...).
_STATE_KEYS = (
    "mamba_d_state",
    "ssm_cfg",
    "state_size",
    "mamba_expand",
    "attn_layer_period",
    "layers_block_type",
    "linear_attn_config",
    "rwkv_version",
)


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON of `path` (a config.json, or a model directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"no model config at {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read {p} as a config.json: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{p} is not a model config (a JSON object)")
    return data


def shape_from_config(config: dict[str, Any], name: str) -> ModelShape:
    """Raises PlanError for a config this planner cannot describe (the message says why)."""
    cfg = config.get("text_config") if "num_hidden_layers" not in config and "text_config" in config else config
    if not isinstance(cfg, dict):
        raise PlanError(f"{name}: text_config is not an object")
    kind = cfg.get("model_type") or config.get("model_type") or "unknown"
    state = [k for k in _STATE_KEYS if cfg.get(k) is not None]
    if state:
        raise PlanError(
            f"{name} ({kind}) has layers without a per-token KV cache ({', '.join(state)}); "
            "the planner sizes attention KV only: give the KV shape with --layers/--kv-heads/--head-dim"
        )
    layer_types = cfg.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types):
        raise PlanError(
            f"{name} ({kind}) mixes layer types {sorted(set(layer_types))}: per-layer KV sizes "
            "are not modelled; give the KV shape with --layers/--kv-heads/--head-dim"
        )
    layers = _int(cfg, name, "num_hidden_layers")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
    if dtype not in _DTYPES:
        raise PlanError(f"{name}: unknown dtype {dtype!r}; give --dtype")
    nbytes = _DTYPES[dtype]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if cfg.get("kv_lora_rank") is not None:
        rope = _int(cfg, name, "qk_rope_head_dim")
        latent = _int(cfg, name, "kv_lora_rank") + rope
        # Prefill attends per head over the query/key width (nope + rope dims), not the latent.
        width = _int(cfg, name, "num_attention_heads") * (int(cfg.get("qk_nope_head_dim") or 0) + rope)
        return ModelShape(
            name,
            layers,
            1,
            latent,
            nbytes,
            latent_dim=latent,
            attn_dim=width,
            weight_bytes=nbytes,
            sliding_window=window,
        )
    heads = _int(cfg, name, "num_attention_heads")
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    hidden = _int(cfg, name, "hidden_size")
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    arch = _architecture(cfg, kind, hidden, layers, heads, kv_heads, head_dim)
    if arch is None:
        return ModelShape(
            name,
            layers,
            kv_heads,
            head_dim,
            nbytes,
            attn_dim=heads * head_dim,
            weight_bytes=nbytes,
            sliding_window=window,
        )
    return arch.shape(name, nbytes, nbytes, window)


def _architecture(
    cfg: dict[str, Any], kind: str, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int
) -> Architecture | None:
    """The parameter-count fields, if this is a gated-MLP transformer (dense or Mixtral-style
    MoE) whose count the planner derives; None otherwise (the count must be given)."""
    moe_keys = ("n_routed_experts", "moe_intermediate_size", "num_experts", "n_shared_experts")
    if any(cfg.get(k) for k in moe_keys) or not cfg.get("vocab_size") or not cfg.get("intermediate_size"):
        return None
    return Architecture(
        int(cfg["vocab_size"]),
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        int(cfg["intermediate_size"]),
        bool(cfg.get("tie_word_embeddings", False)),
        bool(cfg.get("attention_bias", kind == "qwen2")),
        int(cfg.get("num_local_experts") or 1),
        int(cfg.get("num_experts_per_tok") or 1),
    )


def _int(cfg: dict[str, Any], name: str, key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or value <= 0:
        raise PlanError(f"{name}: config has no positive {key} ({value!r}); give the KV shape with flags")
    return value
