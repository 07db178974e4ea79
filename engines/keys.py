"""Content-addressed block keys: equal token prefixes give equal keys in every process and host.

A block of `block_size` tokens is named by a chained hash, as vLLM and SGLang do:

    h_0 = ROOT(scheme)            h_i = H(h_{i-1}, tokens_i, extra)

H is keyed BLAKE2b-128 whose key is derived from the scheme's explicit seed, never Python's
`hash()`, so no PYTHONHASHSEED can make two engines disagree. Only full blocks are named: the
partial last block of a prompt is always recomputed. The store key is
`{tenant}/{model}/{layout}/{hash_hex}` (plus `/{part}` for per-layer objects), so blocks of
different tenants, models, dtypes or layouts can never be confused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import quote

import numpy as np

HASH_VERSION = "blake2b-128-v1"
_PERSON = b"kvstore-blocks"          # BLAKE2 personalisation: these hashes mean nothing elsewhere


@dataclass(frozen=True)
class KeyScheme:
    """How one deployment names its KV blocks. Every engine and router sharing KV must agree on
    all fields; `fingerprint` is what they compare."""

    model: str
    layout: str                      # dtype, block size, cache shape and object granularity
    block_size: int
    tenant: str = "default"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        for name in ("model", "layout", "tenant"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")

    @property
    def namespace(self) -> str:
        # Quoting keeps '/' inside a component (e.g. "meta-llama/Llama-2-7b") from shifting fields.
        return "/".join(quote(part, safe="") for part in (self.tenant, self.model, self.layout))

    @property
    def fingerprint(self) -> str:
        """A digest of everything that decides a key; equal fingerprints mean interchangeable KV."""
        desc = json.dumps([HASH_VERSION, self.namespace, self.block_size, self.seed])
        return hashlib.blake2b(desc.encode(), digest_size=16).hexdigest()

    def _hasher(self) -> "hashlib._Hash":
        return hashlib.blake2b(digest_size=16, key=self.seed.to_bytes(16, "little", signed=True),
                               person=_PERSON)

    @property
    def root(self) -> bytes:
        """The parent of the first block; depends on the seed and block size only."""
        h = self._hasher()
        h.update(b"root" + self.block_size.to_bytes(4, "little"))
        return h.digest()

    def full_blocks(self, num_tokens: int) -> int:
        return num_tokens // self.block_size

    def block_hashes(self, tokens: Sequence[int], extra: bytes = b"",
                     parent: bytes | None = None) -> list[bytes]:
        """The chained hash of every full block of `tokens`; `extra` (adapter id, image hashes, ...)
        enters every block's hash."""
        ids = np.asarray(tokens, dtype="<i8")
        prev = self.root if parent is None else parent
        out = []
        for b in range(len(ids) // self.block_size):
            h = self._hasher()
            h.update(prev)
            h.update(ids[b * self.block_size:(b + 1) * self.block_size].tobytes())
            h.update(len(extra).to_bytes(4, "little") + extra)
            prev = h.digest()
            out.append(prev)
        return out

    def key(self, block_hash: bytes, part: int | None = None) -> str:
        """The store key of a block, or of one part (layer plane) of it."""
        base = f"{self.namespace}/{block_hash.hex()}"
        return base if part is None else f"{base}/{part}"

    def block_keys(self, tokens: Sequence[int], extra: bytes = b"") -> list[str]:
        return [self.key(h) for h in self.block_hashes(tokens, extra)]

    def object_keys(self, hashes: Sequence[bytes], parts: Sequence[int] | None = None) -> list[str]:
        """The keys of the objects holding these blocks, block-major: one per block, or with
        `parts` one per (block, part) as block 0's parts, then block 1's, ... so that
        match_prefix(keys) // len(parts) counts the leading blocks stored whole."""
        if parts is None:
            return [self.key(h) for h in hashes]
        return [self.key(h, p) for h in hashes for p in parts]

    @property
    def scheme_key(self) -> str:
        """Where the scheme itself is recorded, so a mismatched seed is refused, not a silent miss."""
        return f"{self.namespace}/scheme"

    def describe(self) -> bytes:
        return json.dumps({"hash": HASH_VERSION, "namespace": self.namespace,
                           "block_size": self.block_size, "fingerprint": self.fingerprint},
                          sort_keys=True).encode()
