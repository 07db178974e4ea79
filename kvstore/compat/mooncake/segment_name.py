"""The name `get_hostname` answers: Mooncake's `host:port` of a client's Transfer Engine.

Mooncake names each client's segment by its `local_hostname`; given without a port, its Transfer
Engine takes a free one between 12300 and 14300 and the name becomes `host:port`. A kvstore client
runs no Transfer Engine server, but the name must still be one per store, as Mooncake's segment
names are: the port is reserved by binding a socket to it (not listening) until the store closes.
"""

from __future__ import annotations

import random
import socket

PORTS = range(12300, 14301)  # Mooncake's Transfer Engine RPC ports when none is given


def has_port(hostname: str) -> bool:
    """Whether `hostname` already names a port: `host:1234`, `[::1]:1234` (a bare IPv6 address
    such as `::1` does not)."""
    head, sep, tail = hostname.rpartition(":")
    return bool(sep) and tail.isdigit() and (":" not in head or (head.startswith("[") and head.endswith("]")))


class SegmentName:
    """`name` is `local_hostname` as given when it has a port, else `local_hostname:PORT` with
    PORT in PORTS held by this object until `release`."""

    def __init__(self, local_hostname: str, rng: random.Random | None = None) -> None:
        self._socket: socket.socket | None = None
        if has_port(local_hostname):
            self.name = local_hostname
            return
        self._socket, port = _reserve((rng or random.Random()).randrange(len(PORTS)))
        self.name = f"{local_hostname}:{port}"

    def release(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _reserve(start: int) -> tuple[socket.socket, int]:
    """A socket bound to the first free port of PORTS from index `start` on, wrapping round;
    OSError if every one is taken."""
    for i in range(len(PORTS)):
        port = PORTS[(start + i) % len(PORTS)]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("", port))
        except OSError:
            sock.close()
            continue
        return sock, port
    raise OSError(f"no free port in {PORTS.start}..{PORTS.stop - 1} for the store's name")
