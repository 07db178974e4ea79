"""Signing and checking data-plane grants, and the receipts that prove a write was taken.

The metadata service signs a grant for every replica it hands out. A daemon serves a data-plane
request only for a grant whose MAC checks, that has not expired, whose mode matches, whose range
lies inside the segment, and that is not LOCAL (LOCAL grants are for same-host shm access, where
the client library alone applies them). A write grant is good for one write: the daemon takes
it once (GrantChecker in kvstore/transport/base.py) and answers with a receipt, a MAC over the
grant that only the service and the daemons can make, which the writer hands to PutEnd. The MAC
key is shared by the service and its daemons (config `secret`).

So the service knows, per grant, whether a daemon can still honour it: a READ grant until it
expires; a WRITE grant until it expires, unless a receipt shows it was used; a LOCAL grant never
(a daemon refuses it). Space is reused only once no grant for it can be honoured (MetaState).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Sequence

from kvstore import tokens
from kvstore.errors import InvalidArgument, PermissionDenied
from kvstore.types import Grant, GrantMode, new_grant

MAC_BYTES = 16
RECEIPT_BYTES = 16
LOCAL = 1  # Grant.flags: usable only through a same-host transport (shm); daemons refuse it
_FIELDS = struct.Struct("<QQBBQ")
# A grant on the data plane's wire (tcp, ucx): offset, length, mode, flags, expires_ms, mac. The
# segment id travels once per request, not per grant.
GRANT_ITEM = struct.Struct(f"<QQBBQ{MAC_BYTES}s")


def local_piece(grant: Grant, offset: int, length: int) -> Grant:
    """A sub-range of a LOCAL grant (a region's), for the writer's own shm mapping. LOCAL grants
    are applied by the client library alone (no daemon accepts one), so the piece keeps the
    region's MAC: it authenticates nothing, and the service checks what is committed."""
    if not grant.flags & LOCAL:
        raise InvalidArgument("only a LOCAL grant is cut into pieces on the client")
    if offset < grant.offset or offset + length > grant.offset + grant.length or length <= 0:
        raise InvalidArgument(f"[{offset}, +{length}) is outside the grant [{grant.offset}, +{grant.length})")
    return Grant(grant.segment_id, offset, length, grant.mode, grant.expires_ms, grant.mac, grant.flags)


def pack_grants(grants: Sequence[Grant]) -> bytes:
    """The grants as consecutive GRANT_ITEMs; InvalidArgument if a field does not fit."""
    try:
        return b"".join(GRANT_ITEM.pack(g.offset, g.length, int(g.mode), g.flags, g.expires_ms, g.mac) for g in grants)
    except struct.error as exc:
        raise InvalidArgument(f"a grant field does not fit the data plane's wire format: {exc}") from exc


def unpack_grants(segment_id: str, table: bytes | memoryview) -> list[Grant]:
    """The grants of a GRANT_ITEM table (its length a multiple of the item size); InvalidArgument
    for a mode that is not READ or WRITE."""
    try:
        return [
            Grant(segment_id, o, n, GrantMode(m), e, mac, f) for o, n, m, f, e, mac in GRANT_ITEM.iter_unpack(table)
        ]
    except (ValueError, struct.error) as exc:
        raise InvalidArgument(f"malformed grant table: {exc}") from exc


class GrantSigner:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("grant secret must be at least 16 bytes")
        # Keyed BLAKE2s is a MAC by design (no HMAC wrapper needed) and ~4x cheaper per grant,
        # which matters at thousands of grants per batch. Its key is at most 32 bytes.
        # Copying a keyed state skips the key block's compression on every grant.
        self._keyed = hashlib.blake2s(key=hashlib.blake2s(secret).digest(), digest_size=MAC_BYTES)
        self._receipts = hashlib.blake2s(key=hashlib.blake2s(b"receipt\0" + secret).digest(), digest_size=RECEIPT_BYTES)
        self._ids: dict[str, bytes] = {}
        self.daemon_token = tokens.daemon_token(secret)  # what daemons authenticate with

    def _mac(self, segment_id: str, offset: int, length: int, mode: int, flags: int, expires_ms: int) -> bytes:
        prefix = self._ids.get(segment_id)
        if prefix is None:
            if len(self._ids) > 65536:
                self._ids.clear()
            prefix = self._ids[segment_id] = segment_id.encode() + b"\0"
        h = self._keyed.copy()
        h.update(prefix + _FIELDS.pack(offset, length, mode, flags, expires_ms))
        return h.digest()

    def sign(
        self, segment_id: str, offset: int, length: int, mode: GrantMode, expires_ms: int, flags: int = 0
    ) -> Grant:
        mac = self._mac(segment_id, offset, length, int(mode), flags, expires_ms)
        return new_grant(segment_id, offset, length, mode, expires_ms, mac, flags)

    def check(self, grant: Grant, mode: GrantMode, now_ms: int, segment_capacity: int) -> None:
        """Raise PermissionDenied unless a daemon may honour `grant` for `mode` now."""
        expected = self._mac(
            grant.segment_id, grant.offset, grant.length, int(grant.mode), grant.flags, grant.expires_ms
        )
        if not hmac.compare_digest(expected, grant.mac):
            raise PermissionDenied(
                f"grant for segment {grant.segment_id!r} has a bad signature: "
                "ask the metadata service for a new one (and check the shared secret)"
            )
        if grant.flags & LOCAL:
            raise PermissionDenied("a same-host (shm) grant cannot be used over the network: ask again without shm")
        if grant.mode != mode:
            raise PermissionDenied(f"grant is for {grant.mode.name}, request is {mode.name}")
        if grant.expires_ms < now_ms:
            raise PermissionDenied(f"grant expired {now_ms - grant.expires_ms} ms ago: ask again")
        if grant.offset + grant.length > segment_capacity:
            raise PermissionDenied(f"grant range [{grant.offset}, +{grant.length}) is outside the segment")

    def receipt(self, grant: Grant) -> bytes:
        """Proof that a daemon took this write grant (and will take it no more)."""
        h = self._receipts.copy()
        h.update(grant.mac)
        return h.digest()

    def receipt_ok(self, grant: Grant, receipt: bytes) -> bool:
        return len(receipt) == RECEIPT_BYTES and hmac.compare_digest(self.receipt(grant), receipt)
