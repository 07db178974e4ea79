"""Transports by name. Each is imported only when first asked for, so optional extras
(mooncake, nixl, ucx) cost nothing unless used, and a missing one gives a message naming the extra."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from kvstore.errors import InvalidArgument, Unavailable

if TYPE_CHECKING:  # the interface module is imported with the first transport, not before
    from kvstore.transport.base import Transport, TransportServer


@dataclass(frozen=True)
class _Entry:
    client: str  # "module:class" of the client side (a Transport)
    server: str  # "module:class" of the daemon side (a TransportServer)
    extra: str | None = None  # pip extra that provides its dependencies
    # Whether the daemon checks a grant for every byte range it moves. shm (a file the client
    # maps), mooncake and nixl (one-sided remote memory reads and writes) do not: a client that
    # reaches them can read the whole segment, so the service offers them only to tenants trusted
    # with that.
    confined: bool = True


_TRANSPORTS: dict[str, _Entry] = {
    "shm": _Entry("kvstore.transport.shm:ShmTransport", "kvstore.transport.shm:ShmServer", confined=False),
    "tcp": _Entry("kvstore.transport.tcp_client:TcpTransport", "kvstore.transport.tcp_server:TcpServer"),
    "mooncake": _Entry(
        "kvstore.transport.mooncake_client:MooncakeTransport",
        "kvstore.transport.mooncake_server:MooncakeServer",
        extra="mooncake",
        confined=False,
    ),
    # One-sided reads and writes like mooncake (nixl_agent.py): the daemon sees no request.
    "nixl": _Entry(
        "kvstore.transport.nixl_client:NixlTransport",
        "kvstore.transport.nixl_server:NixlServer",
        extra="nixl",
        confined=False,
    ),
    "ucx": _Entry("kvstore.transport.ucx_client:UcxTransport", "kvstore.transport.ucx_server:UcxServer", extra="ucx"),
    "tls": _Entry("kvstore.transport.tls_transport:TlsTransport", "kvstore.transport.tls_transport:TlsServer"),
    # The reference transport: a client and a daemon in one process (tests, embedded use).
    "inproc": _Entry("kvstore.transport.inproc:InprocTransport", "kvstore.transport.inproc:InprocServer"),
}


def names() -> list[str]:
    return list(_TRANSPORTS)


def unconfined() -> frozenset[str]:
    """Transports that check no grant per byte range (see _Entry.confined)."""
    return frozenset(name for name, entry in _TRANSPORTS.items() if not entry.confined)


def _load(name: str, attr: str) -> type:
    entry = _TRANSPORTS.get(name)
    if entry is None:
        raise InvalidArgument(f"unknown transport {name!r}; known: {', '.join(_TRANSPORTS)}")
    module_name, _, class_name = getattr(entry, attr).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'kvcachestore[{entry.extra}]'" if entry.extra else "reinstall kvcachestore"
        raise Unavailable(f"transport {name!r} needs a library that is not installed ({exc}); run: {hint}") from exc
    cls: type = getattr(module, class_name)
    return cls


def client_class(name: str) -> type[Transport]:
    return cast("type[Transport]", _load(name, "client"))


def server_class(name: str) -> type[TransportServer]:
    return cast("type[TransportServer]", _load(name, "server"))
