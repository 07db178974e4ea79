"""Which block a store key names, and the 64-bit hash KV events carry for it.

{tenant}/{model}/{layout}/{32 hex}          an engine block (kvstore.blockhash): its hash is
{tenant}/{model}/{layout}/{32 hex}/{part}   the digest's low 64 bits, as vLLM converts its own;
                                            every part of a block is that block
a decimal or 0x-hex u64                     that number (Mooncake master's convention)
anything else                               XXH3-64 (seed 0) of the key's UTF-8 bytes: stable
                                            across processes, and never a prefix chain

This runs once per key the store commits or drops (on the feed's thread), so it is written for
speed: no split unless the key ends like a block, C hashes, tuples built directly.
"""

from __future__ import annotations

from typing import NamedTuple

import xxhash

from kvstore.blockhash import DIGEST_BYTES

_HEX_LEN = 2 * DIGEST_BYTES
_U64 = 1 << 64
_LOW64 = _U64 - 1
_new = tuple.__new__  # a NamedTuple without its Python-level __new__ (4x cheaper)


class BlockRef(NamedTuple):
    block: str  # the key without a part suffix: what an event announces
    namespace: str | None  # {tenant}/{model}/{layout} of an engine block, None for other keys
    hash: int  # the ExternalBlockHash events carry (0 <= hash < 2**64)


def block_ref(key: str) -> BlockRef:
    if len(key) > _HEX_LEN and key[-_HEX_LEN - 1] == "/" and key.count("/") == 3:
        try:  # int() would also take a sign, "_" or spaces: such keys are taken as blocks, harmlessly
            return _new(BlockRef, (key, key[: -_HEX_LEN - 1], int(key[-_HEX_LEN:], 16) & _LOW64))
        except ValueError:
            pass
    head, _, last = key.rpartition("/")
    if head and _is_part(last) and len(head) > _HEX_LEN and head[-_HEX_LEN - 1] == "/" and head.count("/") == 3:
        digest = _digest(head[-_HEX_LEN:])
        if digest is not None:
            return _new(BlockRef, (head, head[: -_HEX_LEN - 1], digest & _LOW64))
    number = _u64(key)
    if number is not None:
        return _new(BlockRef, (key, None, number))
    return _new(BlockRef, (key, None, xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogatepass"))))


def _digest(text: str) -> int | None:
    if not text.isalnum():  # int(text, 16) alone would take "+", "_" or spaces
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _is_part(text: str) -> bool:
    return text.removeprefix("-").isdigit()


def _u64(key: str) -> int | None:
    try:
        if key.isdigit():
            value = int(key)
        elif key[:2] in ("0x", "0X") and len(key) > 2:
            value = int(key[2:], 16)
        else:
            return None
    except ValueError:
        return None
    return value if value < _U64 else None
