"""Content-addressed block keys: equal token prefixes give equal keys in every process and host.

A block of `block_size` tokens is named by a chained hash, as vLLM and SGLang do:

    h_0 = ROOT(scheme)            h_i = H(h_{i-1}, tokens_i, extra)

The hash itself is kvstore.blockhash (keyed BLAKE2b-128, explicitly seeded), shared with the
metadata service's indexer and the router, which must not import the engines. Only full blocks
are named: the partial last block of a prompt is always recomputed. The store key is
`{tenant}/{model}/{layout}/{hash_hex}` (plus `/{part}` for per-layer objects), so blocks of
different tenants, models, dtypes or layouts can never be confused.

Which shard of the model's KV a process holds is part of the layout (`Shard.tag`), except where
several tensor-parallel ranks hold identical KV (MLA's latent cache, or GQA heads replicated
across ranks): those ranks share one key, only the first of them writes, and every one reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

from kvstore import blockhash
from kvstore.blockhash import DIGEST_BYTES, HASH_VERSION
from kvstore.errors import InvalidArgument

__all__ = ["HASH_VERSION", "KeyScheme", "Shard"]


class Granularity(str, Enum):
    """What one stored object holds: a whole block (every layer), or one layer of a block."""

    BLOCK = "block"
    LAYER = "layer"


@dataclass(frozen=True)
class KeyScheme:
    """How one deployment names its KV blocks. Every engine and router sharing KV must agree on
    all fields; `fingerprint` is what they compare."""

    model: str
    layout: str  # dtype, block size, cache shape and object granularity
    block_size: int
    tenant: str = "default"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        for name in ("model", "layout", "tenant"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")

    @cached_property  # asked for once per key: a 2K-token prompt names thousands
    def namespace(self) -> str:
        return blockhash.namespace(self.tenant, self.model, self.layout)

    @property
    def fingerprint(self) -> str:
        """A digest of everything that decides a key; equal fingerprints mean interchangeable KV."""
        desc = json.dumps([HASH_VERSION, self.namespace, self.block_size, self.seed])
        return hashlib.blake2b(desc.encode(), digest_size=16).hexdigest()

    @property
    def root(self) -> bytes:
        """The parent of the first block; depends on the seed and block size only."""
        return blockhash.root(self.block_size, self.seed)

    def full_blocks(self, num_tokens: int) -> int:
        return num_tokens // self.block_size

    def block_hashes(self, tokens: Sequence[int], extra: bytes = b"", parent: bytes | None = None) -> list[bytes]:
        """The chained hash of every full block of `tokens`; `extra` (adapter id, image hashes, ...)
        enters every block's hash."""
        return blockhash.chain(tokens, self.block_size, self.seed, extra, parent)

    def key(self, block_hash: bytes, part: int | None = None) -> str:
        """The store key of a block, or of one part (layer plane) of it."""
        base = f"{self.namespace}/{block_hash.hex()}"
        return base if part is None else f"{base}/{part}"

    def named(self, name: str, part: int | None = None) -> str:
        """The store key of a block an engine names itself (SGLang's page hashes), in this
        scheme's namespace."""
        base = f"{self.namespace}/{name}"
        return base if part is None else f"{base}/{part}"

    def block_keys(self, tokens: Sequence[int], extra: bytes = b"") -> list[str]:
        return [self.key(h) for h in self.block_hashes(tokens, extra)]

    def object_keys(self, hashes: Sequence[bytes], parts: Sequence[int] | None = None) -> list[str]:
        """The keys of the objects holding these blocks, block-major: one per block, or with
        `parts` one per (block, part) as block 0's parts, then block 1's, ... so that
        match_prefix(keys) // len(parts) counts the leading blocks stored whole."""
        ns = self.namespace
        if parts is None:
            return [f"{ns}/{h.hex()}" for h in hashes]
        suffixes = [f"/{p}" for p in parts]
        return [base + s for base in [f"{ns}/{h.hex()}" for h in hashes] for s in suffixes]

    @property
    def scheme_key(self) -> str:
        """Where the scheme itself is recorded, so a mismatched seed is refused, not a silent miss."""
        return f"{self.namespace}/scheme"

    def describe(self) -> bytes:
        return json.dumps(
            {
                "hash": HASH_VERSION,
                "namespace": self.namespace,
                "block_size": self.block_size,
                "fingerprint": self.fingerprint,
            },
            sort_keys=True,
        ).encode()


def engine_name(engine_hash: bytes) -> bytes:
    """A block named by the engine's own hash (vLLM's 32-byte SHA-256 block hash): its last
    DIGEST_BYTES bytes, zero-padded if shorter. KV events read a key's low 64 bits as its block
    hash, which is then the engine's own (vLLM's `maybe_convert_block_hash`)."""
    return bytes(engine_hash)[-DIGEST_BYTES:].rjust(DIGEST_BYTES, b"\0")


@dataclass(frozen=True)
class Shard:
    """The slice of a model's KV one engine process holds, as it enters the key layout.

    `tp_replicas` consecutive tensor-parallel ranks hold byte-identical KV (vLLM's
    `kv_tp_replicas`: the whole TP group for MLA's latent cache, tp_size // num_kv_heads for GQA
    heads replicated across ranks). Replicas name their blocks identically, so the store holds
    one copy where it would hold `tp_replicas`; `writes` says which replica stores it."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    tp_replicas: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.tp_rank < self.tp_size and 0 <= self.pp_rank < self.pp_size):
            raise InvalidArgument(
                f"shard out of range: tp {self.tp_rank}/{self.tp_size}, pp {self.pp_rank}/{self.pp_size}"
            )
        if self.tp_replicas < 1 or self.tp_size % self.tp_replicas:
            raise InvalidArgument(f"tp_replicas {self.tp_replicas} does not divide tp_size {self.tp_size}")

    @property
    def writes(self) -> bool:
        """True for the one rank of each group of replicas that stores their shared blocks."""
        return self.tp_rank % self.tp_replicas == 0

    @property
    def tag(self) -> str:
        """`tp{rank}of{size}-pp{rank}of{size}`; replicas name their common shard and the replica
        count (`tp0of1r2`: MLA at TP=2), which keeps them apart from a TP=1 deployment's keys."""
        r = self.tp_replicas
        tp = f"tp{self.tp_rank}of{self.tp_size}" if r == 1 else f"tp{self.tp_rank // r}of{self.tp_size // r}r{r}"
        return f"{tp}-pp{self.pp_rank}of{self.pp_size}"
