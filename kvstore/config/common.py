"""What the processes' settings share: the well-known ports and names, the checks every section
uses, and the grant secret."""

from __future__ import annotations

import os
import secrets

from kvstore.connlimit import Limits
from kvstore.errors import InvalidArgument
from kvstore.tokens import TOKEN_ENV as TOKEN_ENV  # a client's bearer token, read by kvstore.tokens

DEFAULT_META_PORT = 50051
# UCX over tcp only. Its shared-memory transports are 4-6x faster on one host (where kvstore's own shm
# transport is preferred anyway) but a peer killed mid-transfer can wedge the survivor's UCX worker
# (sysv, posix), or abort the survivor (cma): see kvstore/transport/ucx_client.py.
DEFAULT_UCX_TLS = "tcp,self"
# Used only when no secret is configured; kvstore warns loudly whenever it is in effect.
INSECURE_DEV_SECRET = "kvstore-insecure-development-secret"
# Settings that several parts share have one environment name, whatever the section.
SECRET_ENV = "KVSTORE_SECRET"
META_ENV = "KVSTORE_META"


def require_tls(cert: str, key: str, ca: str) -> None:
    require(bool(cert) == bool(key), "give tls_cert and tls_key together")
    require(not ca or bool(cert), "tls_ca (mutual TLS) needs tls_cert and tls_key: the service speaks TLS first")


def require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidArgument(message)


def limits(total: int, per_peer: int, idle_s: float, header_s: float) -> Limits:
    try:
        return Limits(total, per_peer, idle_s, header_s)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc


def split_sizes(total: int, piece: int) -> list[int]:
    """`total` bytes as segments of `piece` (a last, smaller one if it is at least 4 KiB)."""
    full, rest = divmod(total, piece)
    return [piece] * full + ([rest] if rest >= 4096 else [])


def resolve_secret(configured: str) -> tuple[bytes, bool]:
    """(secret bytes, is_insecure_default): the configured secret, else $KVSTORE_SECRET, else the
    development default."""
    secret = configured or os.environ.get(SECRET_ENV, "")
    if secret:
        return secret.encode(), False
    return INSECURE_DEV_SECRET.encode(), True


def random_secret() -> str:
    return secrets.token_hex(16)
