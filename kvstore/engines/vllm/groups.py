"""A hybrid model's KV cache groups, as kvstore names and needs them.

vLLM's hybrid memory allocator gives each kind of layer its own KV cache group: its own block size,
its own block table, and its own rule for which blocks a prefix hit needs. Full attention needs
every block of the prefix; sliding-window attention only the blocks that hold the last
`window - 1` tokens before the hit's end (vLLM frees the others and points them at its null block);
a state group (Mamba, linear attention) only the block holding the state at the hit's end.

kvstore names KV in *chunks* of `chunk_tokens` = the least common multiple of the groups' block
sizes, so that every chunk boundary is a block boundary of every group. A chunk is stored as ONE
object holding every group's blocks of that chunk (see staged_codec.py for why one object), so
whether a chunk is stored is one yes or no for all groups together. `hit_chunks` then applies
vLLM's own rule over those answers: the longest prefix whose needed chunks are all stored.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvstore.errors import InvalidArgument

# vLLM's block pool hands out block 0 first and keeps it as the null block: the block-table entry
# of a block that holds nothing (outside a sliding window, a state group's older blocks).
NULL_BLOCK = 0


class UnsupportedGroups(InvalidArgument):
    """The model has a KV cache group kvstore cannot store and restore as a prefix."""


class GroupKind(str, Enum):
    FULL = "full"  # every block of the prefix
    SLIDING = "sliding"  # the blocks of the last `window - 1` tokens
    STATE = "state"  # the block at the end of the prefix (Mamba, linear attention)


_TAGS = {GroupKind.FULL: "f", GroupKind.SLIDING: "s", GroupKind.STATE: "m"}


@dataclass(frozen=True)
class CacheGroup:
    index: int
    kind: GroupKind
    block_size: int
    layer_names: tuple[str, ...]
    window: int = 0  # SLIDING: the window in tokens

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise UnsupportedGroups(f"KV cache group {self.index}: block size {self.block_size}")
        if self.kind is GroupKind.SLIDING and self.window <= 0:
            raise UnsupportedGroups(f"KV cache group {self.index}: sliding window of {self.window} tokens")

    @property
    def tag(self) -> str:
        """`f32` full attention, `s32w4096` sliding window of 4096 tokens, `m64` state (Mamba)."""
        window = f"w{self.window}" if self.kind is GroupKind.SLIDING else ""
        return f"{_TAGS[self.kind]}{self.block_size}{window}"


@dataclass(frozen=True)
class GroupLayout:
    """The groups of one model, in vLLM's order (block ids arrive as one list per group)."""

    groups: tuple[CacheGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise UnsupportedGroups("a model needs at least one KV cache group")
        if [g.index for g in self.groups] != list(range(len(self.groups))):
            raise UnsupportedGroups("KV cache groups must be numbered 0, 1, ... in order")

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    @property
    def chunk_tokens(self) -> int:
        return math.lcm(*(g.block_size for g in self.groups))

    @property
    def tag(self) -> str:
        """Part of the key namespace: chunks of layouts with different tags never mix."""
        return "_".join(g.tag for g in self.groups)

    def blocks_per_chunk(self, group: int) -> int:
        return self.chunk_tokens // self.groups[group].block_size

    def trailing_chunks(self, group: int) -> int | None:
        """How many chunks ending at a hit's end group `group` needs; None: all of them."""
        g = self.groups[group]
        if g.kind is GroupKind.FULL:
            return None
        if g.kind is GroupKind.STATE:
            return 1
        return max(1, math.ceil((g.window - 1) / self.chunk_tokens))

    def hit_chunks(self, stored: Sequence[bool]) -> int:
        """The longest hit (in chunks, from the start) for which every group has what it needs:
        the minimum over groups of each group's own longest hit. `stored[i]`: chunk i is stored."""
        trailing = [self.trailing_chunks(g.index) for g in self.groups]
        limit = len(stored)
        if None in trailing:
            limit = next((i for i, s in enumerate(stored) if not s), len(stored))
        need = max((t for t in trailing if t is not None), default=1)
        for end in range(limit, 0, -1):  # the longest end whose trailing chunks are all stored
            if all(stored[max(0, end - need) : end]):
                return end
        return 0

    @property
    def needs_whole_prefix(self) -> bool:
        """True when some group needs every chunk (then one match_prefix answers a lookup)."""
        return any(g.kind is GroupKind.FULL for g in self.groups)

    def chunk_blocks(self, block_ids: Sequence[Sequence[int]], first: int, last: int) -> list[tuple[int, ...]]:
        """Chunks [first, last) of a request whose block table is `block_ids` (one list per group):
        for each chunk, every group's block ids in group order (NULL_BLOCK past a group's table)."""
        if len(block_ids) != len(self.groups):
            raise InvalidArgument(f"{len(block_ids)} block tables for {len(self.groups)} KV cache groups")
        out = []
        for chunk in range(first, last):
            ids: list[int] = []
            for g, table in enumerate(block_ids):
                n = self.blocks_per_chunk(g)
                part = list(table[chunk * n : (chunk + 1) * n])
                ids += part + [NULL_BLOCK] * (n - len(part))
            out.append(tuple(ids))
        return out

    def whole_chunks(
        self, hashes: Sequence[bytes], block_ids: Sequence[Sequence[int]], first: int
    ) -> list[tuple[bytes, tuple[int, ...]]]:
        """The chunks from `first` on (one per hash) that every group still holds: a chunk whose
        block some group gave back (its sliding window moved past it; vLLM's prefix cache gave it
        as the null block) can never be stored whole, so it is never stored."""
        chunks = self.chunk_blocks(block_ids, first, first + len(hashes))
        return [(h, c) for h, c in zip(hashes, chunks) if NULL_BLOCK not in c]

    @classmethod
    def single(cls, block_size: int, layer_names: Sequence[str] = ()) -> GroupLayout:
        return cls((CacheGroup(0, GroupKind.FULL, block_size, tuple(layer_names)),))

    @classmethod
    def from_kv_cache_config(cls, kv_cache_config: Any) -> GroupLayout:
        """The layout of vLLM's KVCacheConfig; refuses groups that are not a cacheable prefix."""
        from vllm.v1.kv_cache_interface import (
            ChunkedLocalAttentionSpec,
            FullAttentionSpec,
            MambaSpec,
            SlidingWindowSpec,
        )

        groups = []
        for index, group in enumerate(kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            names = tuple(group.layer_names)
            if isinstance(spec, SlidingWindowSpec):
                kind, window = GroupKind.SLIDING, spec.sliding_window + getattr(spec, "extra_retained_tokens", 0)
            elif isinstance(spec, MambaSpec):
                if getattr(spec, "mamba_cache_mode", "none") != "align":
                    raise UnsupportedGroups(
                        f"KV cache group {index} ({type(spec).__name__}) keeps no per-block state "
                        "(mamba_cache_mode is not 'align'): enable prefix caching to store it"
                    )
                kind, window = GroupKind.STATE, 0
            elif isinstance(spec, FullAttentionSpec) and not isinstance(spec, ChunkedLocalAttentionSpec):
                kind, window = GroupKind.FULL, 0
            else:
                raise UnsupportedGroups(
                    f"KV cache group {index} ({type(spec).__name__}, layers {', '.join(names[:3])}...) "
                    "is not a full, sliding-window or state group: kvstore cannot store it"
                )
            groups.append(CacheGroup(index, kind, spec.block_size, names, window))
        return cls(tuple(groups))
