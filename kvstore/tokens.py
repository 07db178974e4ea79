"""Bearer tokens: their form, where a process finds its own, and the local token file.

    tenant token   "kvst_<id>_<secret>"  made by `kvstore tenant token NAME`; the service keeps
                   only its SHA-256, under <id> (8 hex digits, shown by `kvstore tenant list`)
    admin token    whatever $KVSTORE_TOKEN or the token file holds when the service starts (the
                   service makes the file if there is none): the operator's own
    daemon token   "kvsd_<hex>", an HMAC of the grant secret the service and its daemons share:
                   a daemon needs no token of its own

A client uses ClientConfig.token, else $KVSTORE_TOKEN, else the token file: $KVSTORE_TOKEN_FILE,
else $XDG_CONFIG_HOME/kvstore/token (~/.config/kvstore/token), a file only its owner can read
(like Jupyter's token). A token is a credential: it is never logged, never part of a repr, and
never sent anywhere but the metadata service.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
from pathlib import Path

from kvstore.errors import InvalidArgument, Unauthenticated

TOKEN_ENV = "KVSTORE_TOKEN"  # a client's bearer token

__all__ = ["TOKEN_ENV", "admin_token", "client_token", "daemon_token", "digest", "new_tenant_token", "token_file"]

log = logging.getLogger(__name__)

TOKEN_FILE_ENV = "KVSTORE_TOKEN_FILE"
_TENANT = re.compile(r"kvst_([0-9a-f]{8})_[A-Za-z0-9_-]{16,128}")
_DAEMON_PREFIX = "kvsd_"
MAX_TOKEN_CHARS = 512


def token_file() -> Path:
    if os.environ.get(TOKEN_FILE_ENV):
        return Path(os.environ[TOKEN_FILE_ENV]).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "kvstore" / "token"


def client_token(configured: str = "") -> str:
    """The token a client sends: `configured`, else $KVSTORE_TOKEN, else the token file's (if
    there is one it may read), else "" (a service with authentication on refuses it)."""
    if configured:
        return configured
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    try:
        return token_file().read_text().strip()
    except OSError:
        return ""


def admin_token() -> tuple[str, str]:
    """The operator's token for a starting service, and where it came from: $KVSTORE_TOKEN, or
    the token file, made (readable by its owner only) with a fresh token if there is none."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip(), f"${TOKEN_ENV}"
    path = token_file()
    try:
        token = _read_private(path)
    except FileNotFoundError:
        token = _create(path)
    return token, str(path)


def _read_private(path: Path) -> str:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)  # a token others could read is no credential
        log.warning("token file %s was readable by others: made it readable by its owner only", path)
    token = path.read_text().strip()
    if not token:
        raise InvalidArgument(f"token file {path} is empty: delete it (a new token is made) or write a token to it")
    return token


def _create(path: Path) -> str:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = "kvsa_" + secrets.token_urlsafe(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another service made it meanwhile: use that one
        return _read_private(path)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def new_tenant_token() -> tuple[str, str]:
    """(token id, token) for a tenant."""
    token_id = secrets.token_hex(4)
    return token_id, f"kvst_{token_id}_{secrets.token_urlsafe(32)}"


def tenant_token_id(token: str) -> str:
    """The id of a tenant token, or "" for a string that is not one."""
    m = _TENANT.fullmatch(token)
    return m.group(1) if m else ""


def digest(token: str) -> str:
    """What the service keeps of a token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def same_digest(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def daemon_token(secret: bytes) -> str:
    """The token daemons present: derived from the grant secret they share with the service."""
    return _DAEMON_PREFIX + hmac.new(secret, b"kvstore daemon credential v1", hashlib.sha256).hexdigest()


def check_sendable(token: str) -> str:
    """`token` if it can travel in gRPC metadata and a HELLO frame; Unauthenticated if not."""
    if len(token) > MAX_TOKEN_CHARS or not token.isascii() or not token.isprintable():
        raise Unauthenticated(
            f"the token configured is not a kvstore token (at most {MAX_TOKEN_CHARS} printable ASCII characters)"
        )
    return token
