"""The media an indexer reports, in the Conductor API's names, and the bit each has in a mask.

    GPU   an engine's own cache (vLLM's "GPU"), and a storage daemon's GPU tier
    CPU   host memory: kvstore's DRAM tier, an engine's CPU offload ("CPU", "CPU_PINNED")
    DISK  SSD, file systems: kvstore's SSD tier, vLLM's "STORAGE", SGLang's "DISK"

Other names an engine sends are kept (upper-cased) and get the next free bit.
"""

from __future__ import annotations

import threading

from kvstore.types import Tier

GPU, CPU, DISK = "GPU", "CPU", "DISK"
TIER_MEDIUM = {Tier.GPU: GPU, Tier.DRAM: CPU, Tier.SSD: DISK}
_ALIASES = {"STORAGE": DISK, "SSD": DISK, "CPU_PINNED": CPU, "DRAM": CPU, "HOST": CPU}
MAX_MEDIA = 64

_bits: dict[str, int] = {GPU: 0, CPU: 1, DISK: 2}
_names: list[str] = [GPU, CPU, DISK]
_lock = threading.Lock()


def normalize(medium: str | None) -> str:
    """An event's medium in the indexer's names; none given is the engine's own cache (GPU), as
    vLLM's block pool means it."""
    if not medium:
        return GPU
    name = medium.upper()
    return _ALIASES.get(name, name)


def bit(medium: str) -> int:
    """The bit of a (normalized) medium; a new name gets the next one. Raises ValueError past
    MAX_MEDIA names."""
    found = _bits.get(medium)
    if found is not None:
        return found
    with _lock:
        if medium not in _bits:
            if len(_names) >= MAX_MEDIA:
                raise ValueError(f"more than {MAX_MEDIA} distinct KV media; {medium!r} is not tracked")
            _bits[medium] = len(_names)
            _names.append(medium)
        return _bits[medium]


def name(bit_index: int) -> str:
    return _names[bit_index]


def known() -> list[str]:
    return list(_names)
