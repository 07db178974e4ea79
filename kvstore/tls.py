"""TLS for the metadata service (gRPC and the fast lane) and the tls data-plane transport.

The service (or a daemon's tls transport) presents `cert` with `key`; with `ca` it also asks
every caller for a certificate that CA signed (mutual TLS). A client checks the server against
`ca`: a CA bundle, or the server's own self-signed certificate (pinning it), and against the
name it dialled (or `server_name`). Files are PEM; a missing or unreadable one is an
InvalidArgument naming it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.errors import InvalidArgument


@dataclass(frozen=True)
class TlsFiles:
    cert: str = ""
    key: str = ""
    ca: str = ""
    server_name: str = ""  # client side: the name the server's certificate must carry

    @property
    def serving(self) -> bool:
        """Whether a server with these files speaks TLS."""
        return bool(self.cert)

    @property
    def dialling(self) -> bool:
        """Whether a client with these files speaks TLS."""
        return bool(self.ca or self.cert)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the TLS {what} {path!r}: {exc.strerror or exc}") from None


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """For a socket server: TLS 1.2+, `files.cert`, and client certificates checked if `files.ca`."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, files)
    if files.ca:
        _load_ca(ctx, files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """For a socket client: the server checked against `files.ca` (else the system's CAs)."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if files.ca:
        _load_ca(ctx, files.ca)
    if files.cert:
        _load_chain(ctx, files)
    return ctx


def _load_chain(ctx: ssl.SSLContext, files: TlsFiles) -> None:
    for path, what in ((files.cert, "certificate"), (files.key, "key")):
        _read(path, what)  # a clear error for a missing file before OpenSSL's terse one
    try:
        ctx.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as exc:
        raise InvalidArgument(f"TLS certificate {files.cert!r} and key {files.key!r} do not load: {exc}") from None


def _load_ca(ctx: ssl.SSLContext, path: str) -> None:
    _read(path, "CA bundle")
    try:
        ctx.load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise InvalidArgument(f"TLS CA bundle {path!r} does not load: {exc}") from None


def grpc_server_credentials(files: TlsFiles) -> Any:
    import grpc

    pair = (_read(files.key, "key"), _read(files.cert, "certificate"))
    ca = _read(files.ca, "CA bundle") if files.ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def grpc_channel_credentials(files: TlsFiles) -> Any:
    import grpc

    ca = _read(files.ca, "CA bundle") if files.ca else None
    key = _read(files.key, "key") if files.cert else None
    cert = _read(files.cert, "certificate") if files.cert else None
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
