"""The per-block checksum: computed by the writer at put, stored in the index, verified at get."""

from __future__ import annotations

import xxhash

# xxh3-64 runs at ~40 GB/s here, several times memcpy speed, so verifying every get is cheap.
ALGORITHM = "xxh3_64"


def checksum(data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def hasher() -> xxhash.xxh3_64:
    """An incremental checksum: update() with consecutive pieces, then intdigest() == checksum()."""
    return xxhash.xxh3_64()


# Bytes are copied and hashed a piece at a time, each piece hashed right after its copy while it is
# still in cache, so verifying costs little beyond the copy. Every copy-while-hashing uses these.
PIECE = 1 << 20


def copy_hashing(dst: memoryview, src: memoryview, h: xxhash.xxh3_64) -> None:
    """dst[:] = src, feeding src to `h` a piece at a time, right after that piece's copy."""
    for start in range(0, len(src), PIECE):
        piece = src[start : start + PIECE]
        dst[start : start + len(piece)] = piece
        h.update(dst[start : start + len(piece)])


def copy_with_checksum(dst: memoryview, src: memoryview) -> int:
    """dst[:] = src, returning checksum(src) computed while the bytes are still in cache."""
    if len(src) <= PIECE:  # one piece: no incremental hasher
        dst[:] = src
        return xxhash.xxh3_64_intdigest(dst)
    h = hasher()
    copy_hashing(dst, src, h)
    return h.intdigest()
