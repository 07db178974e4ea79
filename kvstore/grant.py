"""Signing and checking data-plane grants.

The metadata service signs a grant for every replica it hands out; a daemon serves a data-plane
request only for a grant whose MAC checks, that has not expired, whose mode matches and whose range
lies inside the segment. The MAC key is shared by the service and its daemons (config `secret`).
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from kvstore.errors import PermissionDenied
from kvstore.types import Grant, GrantMode

MAC_BYTES = 16
_FIELDS = struct.Struct("<QQBQ")


class GrantSigner:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("grant secret must be at least 16 bytes")
        # Keyed BLAKE2s is a MAC by design (no HMAC wrapper needed) and ~4x cheaper per grant,
        # which matters at thousands of grants per batch. Its key is at most 32 bytes.
        # Copying a keyed state skips the key block's compression on every grant.
        self._keyed = hashlib.blake2s(key=hashlib.blake2s(secret).digest(), digest_size=MAC_BYTES)
        self._ids: dict[str, bytes] = {}

    def _mac(self, segment_id: str, offset: int, length: int, mode: int, expires_ms: int) -> bytes:
        prefix = self._ids.get(segment_id)
        if prefix is None:
            if len(self._ids) > 65536:
                self._ids.clear()
            prefix = self._ids[segment_id] = segment_id.encode() + b"\0"
        h = self._keyed.copy()
        h.update(prefix + _FIELDS.pack(offset, length, mode, expires_ms))
        return h.digest()

    def sign(self, segment_id: str, offset: int, length: int, mode: GrantMode, expires_ms: int) -> Grant:
        mac = self._mac(segment_id, offset, length, int(mode), expires_ms)
        return Grant(segment_id, offset, length, mode, expires_ms, mac)

    def check(self, grant: Grant, mode: GrantMode, now_ms: int, segment_capacity: int) -> None:
        """Raise PermissionDenied unless `grant` allows `mode` now, inside the segment."""
        expected = self._mac(grant.segment_id, grant.offset, grant.length, int(grant.mode), grant.expires_ms)
        if not hmac.compare_digest(expected, grant.mac):
            raise PermissionDenied(f"grant for segment {grant.segment_id!r} has a bad signature: "
                                   "ask the metadata service for a new one (and check the shared secret)")
        if grant.mode != mode:
            raise PermissionDenied(f"grant is for {grant.mode.name}, request is {mode.name}")
        if grant.expires_ms < now_ms:
            raise PermissionDenied(f"grant expired {now_ms - grant.expires_ms} ms ago: ask again")
        if grant.offset + grant.length > segment_capacity:
            raise PermissionDenied(f"grant range [{grant.offset}, +{grant.length}) is outside the segment")
