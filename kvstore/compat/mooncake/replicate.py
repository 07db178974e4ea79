"""`ReplicateConfig` as Mooncake's Python class has it, and what kvstore makes of each field.

replica_num                  honoured: copies on distinct daemons (as many as have room)
with_hard_pin                honoured: the key is pinned (kvstore pins carry a TTL: HARD_PIN_TTL_S)
soft_pin_action=ENABLE       honoured: pinned for soft_pin_ttl_ms (or DEFAULT_SOFT_PIN_TTL_S)
soft_pin_action=DISABLE      honoured: an existing pin is dropped
soft_pin_ttl_ms              None (the default) or an unsigned 64-bit int; set with an action other
                             than ENABLE, every put refuses it with INVALID_PARAMS (Mooncake's master)
prefer_alloc_in_same_node    the bytes API (put, put_batch, put_parts) refuses it with
                             INVALID_PARAMS, as Mooncake does; elsewhere ignored
preferred_segment(s)         ignored: the metadata service places replicas
nof_replica_num, dfs_replica_num > 0   NOT_SUPPORTED (kvstore's SSD tier is on the daemons)
data_type, group_ids         accepted, not used
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from kvstore.compat.mooncake.codes import ErrorCode

HARD_PIN_TTL_S = 10 * 365 * 24 * 3600.0  # "until removed", in a pin that needs a TTL
DEFAULT_SOFT_PIN_TTL_S = 30 * 60.0  # Mooncake's master default is a server setting


class SoftPinAction(IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


_INT_FIELDS = ("replica_num", "nof_replica_num", "dfs_replica_num")
_UINT64 = 1 << 64


def _uint64(name: str, value: Any) -> int:
    """`value` as pybind11 converts it for an unsigned 64-bit field: an int (a bool counts as one)
    in range, else TypeError."""
    if not isinstance(value, int) or not 0 <= value < _UINT64:
        raise TypeError(f"ReplicateConfig.{name} takes an unsigned 64-bit int, not {value!r}")
    return int(value)


class ReplicateConfig:
    """Mutable, like the pybind11 class: only these attributes exist (others raise AttributeError),
    and an int field refuses a value that is not an int (TypeError); soft_pin_ttl_ms is also None."""

    __slots__ = (
        "data_type",
        "dfs_replica_num",
        "group_ids",
        "nof_replica_num",
        "prefer_alloc_in_same_node",
        "preferred_nof_segments",
        "preferred_segment",
        "preferred_segments",
        "replica_num",
        "soft_pin_action",
        "soft_pin_ttl_ms",
        "with_hard_pin",
    )

    def __init__(self) -> None:
        self.replica_num = 1
        self.nof_replica_num = 0
        self.dfs_replica_num = 0
        self.soft_pin_action = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: int | None = None
        self.with_hard_pin = False
        self.preferred_segments: list[str] = []
        self.preferred_nof_segments: list[str] = []
        self.preferred_segment = ""
        self.prefer_alloc_in_same_node = False
        self.data_type = ObjectDataType.UNKNOWN
        self.group_ids: list[str] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _INT_FIELDS or (name == "soft_pin_ttl_ms" and value is not None):
            value = _uint64(name, value)
        object.__setattr__(self, name, value)

    def __str__(self) -> str:
        ttl = "default" if self.soft_pin_ttl_ms is None else self.soft_pin_ttl_ms
        return (
            f"ReplicateConfig: {{ replica_num: {self.replica_num}, nof_replica_num: "
            f"{self.nof_replica_num}, dfs_replica_num: {self.dfs_replica_num}, soft_pin_action: "
            f"{SoftPinAction(self.soft_pin_action).name}, soft_pin_ttl_ms: {ttl}, with_hard_pin: "
            f"{int(self.with_hard_pin)}, preferred_segments: {self.preferred_segments}, "
            f"preferred_nof_segments: {self.preferred_nof_segments}, prefer_alloc_in_same_node: "
            f"{int(self.prefer_alloc_in_same_node)}, data_type: {ObjectDataType(self.data_type).name} }}"
        )


def refusal(config: ReplicateConfig | None, bytes_api: bool = False) -> int:
    """The code a put must return without writing anything under `config`, or 0 if it can go on."""
    if config is None:
        return int(ErrorCode.OK)
    if bytes_api and config.prefer_alloc_in_same_node:
        return int(ErrorCode.INVALID_PARAMS)  # Mooncake: "not supported" on this path
    if config.nof_replica_num or config.dfs_replica_num:
        return int(ErrorCode.NOT_SUPPORTED)
    if config.replica_num < 1:
        return int(ErrorCode.INVALID_PARAMS)
    if config.soft_pin_ttl_ms is not None and config.soft_pin_action != SoftPinAction.ENABLE:
        return int(ErrorCode.INVALID_PARAMS)  # Mooncake's master: a TTL only goes with ENABLE
    return int(ErrorCode.OK)


def pin_ttl_s(config: ReplicateConfig | None) -> float | None:
    """How long a put under `config` pins its keys: None for no pin, 0.0 to drop an existing one."""
    if config is None:
        return None
    if config.with_hard_pin:
        return HARD_PIN_TTL_S
    if config.soft_pin_action == SoftPinAction.ENABLE:
        if config.soft_pin_ttl_ms is None:
            return DEFAULT_SOFT_PIN_TTL_S
        return config.soft_pin_ttl_ms / 1000.0 or None  # 0: ordinary cache, as in Mooncake
    if config.soft_pin_action == SoftPinAction.DISABLE:
        return 0.0
    return None
