"""The block hash engines name KV blocks by, as a pure function that every side can call: the
engines (kvstore/engines/keys.py's KeyScheme), the metadata service's indexer (kvstore/indexer/) and the
router, none of which may import the others.

A block of `block_size` tokens is named by a chained hash, as vLLM and SGLang do:

    h_0 = root(block_size, seed)          h_i = H(h_{i-1}, tokens_i, extra)

H is keyed BLAKE2b-128 whose key is derived from the explicit seed, never Python's `hash()`, so
no PYTHONHASHSEED can make two processes disagree. Only full blocks are named. A store key is
`{namespace}/{hash_hex}` with namespace `{tenant}/{model}/{layout}` (each part URL-quoted), so
the namespace never enters the hash: equal tokens give equal hashes in every namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from urllib.parse import quote

import numpy as np

HASH_VERSION = "blake2b-128-v1"
DIGEST_BYTES = 16
_PERSON = b"kvstore-blocks"  # BLAKE2 personalisation: these hashes mean nothing elsewhere
_LOW64 = (1 << 64) - 1


def _hasher(seed: int) -> hashlib.blake2b:
    return hashlib.blake2b(digest_size=DIGEST_BYTES, key=seed.to_bytes(16, "little", signed=True), person=_PERSON)


def root(block_size: int, seed: int = 0) -> bytes:
    """The parent of a sequence's first block; depends on the seed and block size only."""
    h = _hasher(seed)
    h.update(b"root" + block_size.to_bytes(4, "little"))
    return h.digest()


def chain(
    tokens: Sequence[int], block_size: int, seed: int = 0, extra: bytes = b"", parent: bytes | None = None
) -> list[bytes]:
    """The chained hash of every full block of `tokens`, continuing from `parent` (default: the
    root). `extra` (adapter, cache salt, image hashes...) enters every block's hash."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    ids = np.asarray(tokens, dtype="<i8")
    prev = root(block_size, seed) if parent is None else parent
    tail = len(extra).to_bytes(4, "little") + extra
    out = []
    for b in range(len(ids) // block_size):
        h = _hasher(seed)
        h.update(prev)
        h.update(ids[b * block_size : (b + 1) * block_size].tobytes())
        h.update(tail)
        prev = h.digest()
        out.append(prev)
    return out


def short(digest: bytes) -> int:
    """A block hash as the 64-bit integer KV events and indexers carry: its low 64 bits read
    big-endian, the conversion vLLM applies to its own hashes (maybe_convert_block_hash)."""
    return int.from_bytes(digest, "big") & _LOW64


def namespace(tenant: str, model: str, layout: str) -> str:
    """The key prefix of one deployment's blocks. Quoting keeps a '/' inside a part (e.g.
    "meta-llama/Llama-2-7b") from shifting the fields."""
    return "/".join(quote(part, safe="") for part in (tenant, model, layout))


def extra_key(lora_name: str | None = None, cache_salt: str | None = None) -> bytes:
    """What else decides a block's KV besides its tokens, as the vLLM connector encodes it: the
    LoRA adapter's name and the request's cache salt."""
    parts = []
    if lora_name:
        parts.append(f"lora={lora_name}")
    if cache_salt:
        parts.append(f"salt={cache_salt}")
    return "|".join(parts).encode()
