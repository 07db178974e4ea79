"""How one rank names the pages of each host pool, and which of them it writes.

Pages keep SGLang's own chained SHA-256 names inside a kvstore.engines.keys.KeyScheme namespace of
tenant, model and layout, so instances that lay pages out differently never read each other's
bytes. The layout names the shard the bytes belong to:

- a TP-sharded pool (MHA KV, Mamba state) is keyed by the TP rank: `tp0of2`;
- a rank-replicated pool (SGLang says so with `is_mla_model`: MLA latent KV, its DSA indexer,
  DeepSeek V4's compressed pools) is the same on every TP rank and keyed without it: `mla`. Only
  the writer rank (SGLang's `is_storage_writer`: TP rank 0, or each DCP shard's first rank) stores
  it; every rank reads it. Mamba state stays TP-sharded even in an MLA model, as in SGLang.

Pipeline stages, attention context-parallel ranks and decode context-parallel (DCP) shards hold
different bytes, so they are always part of the shard.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvstore.engines.keys import KeyScheme
from kvstore.engines.sglang.base import KV_POOL, MAMBA_POOL
from kvstore.errors import InvalidArgument


@dataclass(frozen=True)
class Placement:
    """This rank's place among the ranks of one deployment (from SGLang's HiCacheStorageConfig)."""

    rank_shard: str  # the shard of TP-sharded pools: "tp1of2", "tp1of2-pp0of2", ...
    replica_shard: str  # the shard of rank-replicated pools: "mla", "mla-dcp1of2", ...
    replicated: bool  # SGLang's is_mla_model: the primary KV is the same on every TP rank
    writer: bool  # this rank stores the replicated pools

    @classmethod
    def of(cls, cfg: Any) -> Placement:
        tp_rank, tp_size = int(getattr(cfg, "tp_rank", 0)), int(getattr(cfg, "tp_size", 1))
        dcp_rank, dcp_size = int(getattr(cfg, "dcp_rank", 0)), int(getattr(cfg, "dcp_size", 1))
        rest = ""
        if getattr(cfg, "pp_size", 1) > 1:
            rest += f"-pp{cfg.pp_rank}of{cfg.pp_size}"
        if getattr(cfg, "attn_cp_size", 1) > 1:
            rest += f"-cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}"
        replicated = bool(getattr(cfg, "is_mla_model", False))
        dcp = f"-dcp{dcp_rank}of{dcp_size}" if dcp_size > 1 else ""
        return cls(
            rank_shard=f"tp{tp_rank}of{tp_size}{rest}",
            replica_shard=f"mla{dcp}{rest}",
            replicated=replicated,
            # SGLang's own rule (HiCacheStorageConfig.is_storage_writer), for configs without it
            writer=bool(getattr(cfg, "is_storage_writer", not replicated or tp_rank == dcp_rank)),
        )

    def is_replicated(self, pool: str) -> bool:
        return self.replicated and pool != MAMBA_POOL

    def shard(self, pool: str) -> str:
        return self.replica_shard if self.is_replicated(pool) else self.rank_shard

    def writes(self, pool: str) -> bool:
        """Whether this rank stores `pool`'s pages (a replicated pool: the writer rank only)."""
        return self.writer or not self.is_replicated(pool)


@dataclass(frozen=True)
class StoredPool:
    """One host pool as kvstore stores it: a page is `parts` objects, the pool's buffer regions
    of that page in get_page_buffer_meta's order (zero copy), or one flat object (parts 1, flat).
    A logical pool (an anchor without a buffer of its own) has no bytes: parts 0."""

    name: str
    host: Any  # SGLang's host pool
    scheme: KeyScheme
    parts: int
    page_tokens: int  # host indices per page
    flat: bool = False

    @classmethod
    def of(
        cls, name: str, host: Any, placement: Placement, model: str, tenant: str, zero_copy: bool = True
    ) -> StoredPool:
        page = int(getattr(host, "logical_page_size", None) or getattr(host, "page_size", 1) or 1)
        dtype = str(getattr(host, "dtype", "raw")).removeprefix("torch.")
        logical = name == KV_POOL and getattr(host, "kv_buffer", True) is None
        if logical:
            parts, shape = 0, "logical"
        elif zero_copy:
            try:
                _, sizes = host.get_page_buffer_meta(torch.arange(page))
            except (NotImplementedError, ValueError, AttributeError, AssertionError) as exc:
                raise InvalidArgument(f"kvstore HiCache backend: pool {name} cannot move zero copy: {exc}") from exc
            parts = len(sizes)
            same = all(s == sizes[0] for s in sizes)
            shape = f"v1-{parts}x{sizes[0]}" if same else "v1-" + "+".join(str(s) for s in sizes)
        else:
            parts, shape = 1, f"flat{host.get_dummy_flat_data_page().nbytes}"
        pool = "" if name == KV_POOL else f"{name}-"  # the KV pool keeps the names it always had
        fmt = getattr(host, "storage_format_tag", None)
        layout = f"sglang-{placement.shard(name)}-{pool}{dtype}-p{page}-{getattr(host, 'layout', 'layout')}-{shape}"
        if fmt:
            layout += f"-{fmt}"
        return cls(name, host, KeyScheme(model, layout, page, tenant), parts, page, flat=not zero_copy)

    @property
    def physical(self) -> bool:
        return self.parts > 0

    def keys(self, pages: list[str]) -> list[str]:
        """The objects of these pages, page-major (a page's parts together)."""
        if self.parts <= 1:
            return [self.scheme.named(p) for p in pages]
        return [self.scheme.named(p, part) for p in pages for part in range(self.parts)]

    def pages_whole(self, flags: list[bool]) -> list[bool]:
        """Per page: whether every one of its objects is (flags in keys() order)."""
        n = max(self.parts, 1)
        return [all(flags[i : i + n]) for i in range(0, len(flags), n)]

    def regions(self, host_indices: torch.Tensor) -> list[memoryview]:
        """The host pool's memory of these pages (page-aligned indices), as writable views in
        keys() order."""
        ptrs, sizes = self.host.get_page_buffer_meta(host_indices)
        if len(ptrs) != self.parts * (len(host_indices) // self.page_tokens):
            raise ValueError(f"pool {self.name}: {len(ptrs)} regions for {len(host_indices)} indices")
        return [
            np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(ptr)).data  # memoryview(array)
            for ptr, size in zip(ptrs, sizes)
        ]
