"""Where an LMCache ObjectKey lives in kvstore: its key string, and the batches a task splits into.

The key string is `<key_prefix>` followed by the form LMCache's native L2 connectors (its
Mooncake Store adapter among them) give an ObjectKey:

    <model_name>@<kv_rank, 8 hex digits>@<object_group_id, hex>@<chunk_hash, hex>[@<cache_salt>]

so the salt is part of the key even when it maps to no tenant: two salts never share a chunk.
Nothing of LMCache is imported here: an ObjectKey is duck-typed by the fields it reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from kvstore.types import MAX_BATCH_KEYS


class ObjectKeyLike(Protocol):
    chunk_hash: bytes
    model_name: str
    kv_rank: int
    object_group_id: int
    cache_salt: str


def key_string(prefix: str, key: ObjectKeyLike) -> str:
    base = f"{prefix}{key.model_name}@{key.kv_rank:08x}@{key.object_group_id:x}@{key.chunk_hash.hex()}"
    return f"{base}@{key.cache_salt}" if key.cache_salt else base


class Batch(NamedTuple):
    """The keys of one task that go through one tenant's client in one call: `places` are each
    key's place in the task, `keys` their kvstore key strings."""

    cache_salt: str
    places: list[int]
    keys: list[str]


def batches(prefix: str, keys: Sequence[Any]) -> list[Batch]:
    """A task's keys grouped by cache_salt (each salt may be another tenant), in task order within
    a group, and split at kvstore's batch limit."""
    groups: dict[str, Batch] = {}
    out: list[Batch] = []
    for i, key in enumerate(keys):
        group = groups.get(key.cache_salt)
        if group is None or len(group.keys) >= MAX_BATCH_KEYS:
            group = groups[key.cache_salt] = Batch(key.cache_salt, [], [])
            out.append(group)
        group.places.append(i)
        group.keys.append(key_string(prefix, key))
    return out
