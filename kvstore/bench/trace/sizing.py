"""How big the replayed KV is: the model's KV bytes per token, divided by an explicit scale so a
laptop can hold millions of tokens, as whole blocks of BLOCK_TOKENS tokens.

Every block is stored as a full page (BLOCK_TOKENS tokens of KV, as a paged KV cache allocates it)
even where a prompt's last block is partial, so a capacity of C tokens is C // BLOCK_TOKENS blocks
in the store and in the simulators alike. A block's bytes are rounded up to the allocator's 64-byte
alignment (so no space is lost to it); the scale in effect is printed beside the one asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kvstore.bench.trace.format import BLOCK_TOKENS
from kvstore.engines.planner.hf_config import read_config, shape_from_config
from kvstore.engines.planner.model import PRESETS

ALIGNMENT = 64  # kvstore.meta.allocator's default: a block's bytes are a multiple of it
MAX_SEGMENT = 256 << 20  # the daemon's default segment size, the most one segment holds here
_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9}


@dataclass(frozen=True)
class KVSize:
    bytes_per_token: int  # of the real model
    scale: float  # the real KV is divided by this
    source: str  # where bytes_per_token came from

    def __post_init__(self) -> None:
        if self.bytes_per_token <= 0 or self.scale < 1:
            raise ValueError("KV bytes per token must be positive and --scale at least 1")

    @property
    def block_bytes(self) -> int:
        """Bytes stored per block: BLOCK_TOKENS tokens of scaled KV, up to a multiple of ALIGNMENT."""
        need = math.ceil(BLOCK_TOKENS * self.bytes_per_token / self.scale)
        return max(ALIGNMENT, -(-need // ALIGNMENT) * ALIGNMENT)

    @property
    def effective_scale(self) -> float:
        return BLOCK_TOKENS * self.bytes_per_token / self.block_bytes

    def store_bytes(self, capacity_tokens: int) -> int:
        return blocks_of(capacity_tokens) * self.block_bytes

    def segment_bytes(self, capacity_tokens: int) -> int:
        """A segment size holding whole blocks only, so none of the store's DRAM is left unusable."""
        per_segment = max(1, min(blocks_of(capacity_tokens), MAX_SEGMENT // self.block_bytes))
        return per_segment * self.block_bytes

    def describe(self) -> str:
        asked = f"--scale {self.scale:g}"
        effective = (
            f" (in effect 1/{self.effective_scale:.6g})" if abs(self.effective_scale - self.scale) > 1e-9 else ""
        )
        return (
            f"KV {self.bytes_per_token} B/token ({self.source}), scaled 1/{self.scale:g} [{asked}{effective}]: "
            f"{self.block_bytes} B per {BLOCK_TOKENS}-token block"
        )


def blocks_of(tokens: int) -> int:
    return tokens // BLOCK_TOKENS


def parse_tokens(text: str) -> int:
    """A token count: 3000000, 3M, 512k, 1.5M (decimal: 1M = 10**6)."""
    s = text.strip().lower()
    factor = _SUFFIXES.get(s[-1:], 1)
    number = s[:-1] if factor != 1 else s
    try:
        value = float(number) * factor
    except ValueError:
        raise ValueError(f"bad token count {text!r}; use e.g. 1M, 3M, 512k, 100000") from None
    if value < BLOCK_TOKENS or value != int(value):
        raise ValueError(f"token count {text!r} must be a whole number of at least {BLOCK_TOKENS} (one block)")
    return int(value)


def kv_bytes_of_model(model: str) -> tuple[int, str]:
    """(KV bytes per token, its source) of a planner preset (e.g. llama3-8b) or a Hugging Face
    config.json (or a directory holding one): 2 x layers x KV heads x head dim x dtype bytes,
    or layers x latent x dtype bytes for MLA. Raises ValueError (PlanError) if it cannot say."""
    if model in PRESETS:
        return PRESETS[model].kv_bytes_per_token, f"{model}, a `kvstore plan` preset"
    if not Path(model).exists():
        raise ValueError(f"--model {model!r}: no such config.json, nor a preset ({', '.join(PRESETS)})")
    shape = shape_from_config(read_config(model), model)
    return shape.kv_bytes_per_token, f"{model}: {shape.describe()}"
