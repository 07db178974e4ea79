"""Transports by name. Each is imported only when first asked for, so optional extras
(mooncake, ucx) cost nothing unless used, and a missing one gives a message naming the extra."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from kvstore.errors import InvalidArgument, Unavailable


@dataclass(frozen=True)
class _Entry:
    module: str
    client: str
    server: str
    extra: str | None = None   # pip extra that provides its dependencies


_TRANSPORTS: dict[str, _Entry] = {
    "shm": _Entry("kvstore.transport.shm", "ShmTransport", "ShmServer"),
    "tcp": _Entry("kvstore.transport.tcp", "TcpTransport", "TcpServer"),
    "mooncake": _Entry("kvstore.transport.mooncake", "MooncakeTransport", "MooncakeServer", extra="mooncake"),
    "ucx": _Entry("kvstore.transport.ucx", "UcxTransport", "UcxServer", extra="ucx"),
}


def names() -> list[str]:
    return list(_TRANSPORTS)


def _load(name: str, attr: str) -> Any:
    entry = _TRANSPORTS.get(name)
    if entry is None:
        raise InvalidArgument(f"unknown transport {name!r}; known: {', '.join(_TRANSPORTS)}")
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        hint = f"pip install 'kvstore[{entry.extra}]'" if entry.extra else "reinstall kvstore"
        raise Unavailable(f"transport {name!r} needs a library that is not installed ({exc}); "
                          f"run: {hint}") from exc
    return getattr(module, getattr(entry, attr))


def client_class(name: str) -> type:
    return _load(name, "client")


def server_class(name: str) -> type:
    return _load(name, "server")
