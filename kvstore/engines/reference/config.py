"""What an engine instance is: its role and its settings (`kvstore engine` flags build one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kvstore.engines.keys import Granularity
from kvstore.engines.reference.scheduler import SchedulerConfig


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


@dataclass(frozen=True)
class EngineConfig:
    role: Role = Role.COLOCATED
    block_size: int = 16
    cache_blocks: int = 1024
    granularity: Granularity = Granularity.LAYER
    load_deadline_s: float = 5.0
    tenant: str = "default"
    hash_seed: int = 0
    batching: SchedulerConfig = field(default_factory=SchedulerConfig)
    save_output_kv: bool = True  # decode/colocated: save a finished request's new blocks

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.cache_blocks <= 0:
            raise ValueError("block_size and cache_blocks must be positive")
        if self.load_deadline_s <= 0:
            raise ValueError("load_deadline_s must be positive")

    @property
    def saves(self) -> bool:
        """Saves prompt blocks as it computes them."""
        return self.role is not Role.DECODE
