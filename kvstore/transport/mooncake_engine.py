"""`mooncake`: one-sided reads and writes into a daemon's DRAM segments through the Mooncake
Transfer Engine (protocol `tcp` on any host; `rdma`, with device names, in production). This
module holds what both sides share (the engine's start-up and the endpoint address); the sides
are mooncake_client.py and mooncake_server.py.

The daemon registers each DRAM segment's memory with its engine once, at mount, and advertises

    "<protocol>|<segment base address>|<host>:<rpc port>"

The client's engine opens a session to "<host>:<rpc port>" (P2P handshake: no metadata server)
and moves a call's transfers with one batch call per 64 MiB, between the segment and staging
memory registered once per client (the engine may still touch a buffer after a call fails, so
the caller's own buffers are never handed to it); the copy to or from the caller's buffers
computes the checksums the client needs. SSD and GPU segments are not registered, so they offer
no mooncake endpoint.

Trust boundary: like shm, the daemon never sees a request, so it cannot check grants. Any peer
that reaches the daemon engine's two ports (the engine binds them on every interface, whatever
host is configured) can read or write every registered segment, and nothing else: the engine
refuses ranges outside registered memory, and only segment memory is registered. The client
confines itself to its granted ranges, refuses expired grants, and fails fast on a dead
daemon. Offer this transport only on a trusted network.
"""

from __future__ import annotations

import os
import socket

# Bounds on a hung or dead peer, read when an engine is created: without them a transfer to a
# stopped daemon blocks for 30 s. 5 s is the least MC_TRANSFER_TIMEOUT the binding accepts.
for _name, _value in (
    ("MC_TCP_PROGRESS_TIMEOUT_SEC", "2"),
    ("MC_TCP_STATUS_TIMEOUT_SEC", "2"),
    ("MC_TRANSFER_TIMEOUT", "5"),
    ("MC_LOG_LEVEL", "ERROR"),
):
    os.environ.setdefault(_name, _value)

from mooncake.engine import TransferEngine  # noqa: E402  (after the environment it reads)

__all__ = [
    "PeerGone",
    "TransferEngine",
    "advertised_host",
    "listening",
    "local_host_towards",
    "parse_address",
    "start_engine",
]

from kvstore.errors import TransportError, Unavailable  # noqa: E402


def start_engine(host: str, protocol: str, device: str) -> TransferEngine:
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", protocol, device)
    if rc != 0:
        raise Unavailable(
            f"the Mooncake Transfer Engine did not start on {host} over {protocol} "
            f"(devices {device or 'auto'}; rc {rc}); check the protocol and device names"
        )
    return engine


def advertised_host(host: str) -> str:
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host


def parse_address(address: str) -> tuple[str, str, int]:
    """(protocol, session, segment base address) of an endpoint address."""
    protocol, base, session = address.split("|", 2)
    return protocol, session, int(base)


def local_host_towards(session: str) -> str:
    """This host's address on the route to `session` (what the peer would see us as)."""
    host = session.rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))  # UDP: picks a route, sends nothing
            address: str = probe.getsockname()[0]
            return address
    except OSError:
        return "127.0.0.1"


def listening(session: str, timeout: float = 0.5) -> bool | None:
    """Whether anything accepts connections at the session's RPC port: False (refused) means the
    daemon's engine is gone; None: no answer (host down or unreachable). The engine's own
    send_probe is not used: it blocked for 61 s on a stopped daemon."""
    host, _, port = session.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (ConnectionRefusedError, ValueError):
        return False
    except OSError:
        return None
    return True


class PeerGone(TransportError):
    """A transfer failed because the daemon's engine no longer exists."""


__all__ = [
    "PeerGone",
    "TransferEngine",
    "advertised_host",
    "listening",
    "local_host_towards",
    "parse_address",
    "start_engine",
]
