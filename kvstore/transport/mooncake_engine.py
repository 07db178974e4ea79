"""`mooncake`: one-sided reads and writes into a daemon's DRAM segments through the Mooncake
Transfer Engine (protocol `tcp` on any host; `rdma`, with device names, in production). This
module holds what both sides share (the engine's start-up and the endpoint address); the sides
are mooncake_client.py and mooncake_server.py.

The daemon registers each DRAM segment's memory with its engine once, at mount, and advertises

    "<protocol>|<segment base address>|<host>:<rpc port>|<incarnation>"

The client's engine opens a session to "<host>:<rpc port>" (P2P handshake: no metadata server)
and moves a call's transfers with one batch call per 64 MiB, between the segment and staging
memory registered once per client (the engine may still touch a buffer after a call fails, so
the caller's own buffers are never handed to it); the copy to or from the caller's buffers
computes the checksums the client needs. SSD and GPU segments are not registered, so they offer
no mooncake endpoint.

The client's engine keeps what it learnt of a peer for good: the session's descriptor (with the
peer's data port) under "<host>:<rpc port>", and pooled connections under "<host>:<data port>";
it never notices that the peer's engine stopped. An engine draws both its ports at random (by
default from 15000-17000), and a port is free again about a minute after its engine stopped, so
a new engine on that host (a restarted daemon, or any other) can come back under a dead one's
session name or data port; the client's engine would then send its transfers to the dead
peer's data port, or down a dead connection. The incarnation (one per engine start: its time,
then random bits) tells the client which engine a session name stands for, and which of two
is the newer; mooncake_client._Engines acts on it.

Trust boundary: like shm, the daemon never sees a request, so it cannot check grants. Any peer
that reaches the daemon engine's two ports (the engine binds them on every interface, whatever
host is configured) can read or write every registered segment, and nothing else: the engine
refuses ranges outside registered memory, and only segment memory is registered. The client
confines itself to its granted ranges, refuses expired grants, and fails fast on a dead
daemon. Offer this transport only on a trusted network.
"""

from __future__ import annotations

import os
import secrets
import socket
import time

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
    "format_address",
    "listening",
    "local_host_towards",
    "new_incarnation",
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


def new_incarnation() -> str:
    """A name for one engine start, which no other start reuses: its time (ns, 16 hex digits)
    then random bits. Two engines of one host come under one session name (host:rpc port) one
    after the other, so the one whose name sorts first has stopped, and never comes back."""
    return f"{time.time_ns():016x}{secrets.token_hex(4)}"


def format_address(protocol: str, base: int, session: str, incarnation: str) -> str:
    return f"{protocol}|{base}|{session}|{incarnation}"


def parse_address(address: str) -> tuple[str, str, int, str]:
    """(protocol, session, segment base address, incarnation) of an endpoint address; the
    incarnation is "" in the address of a daemon that predates it."""
    fields = address.split("|")
    if len(fields) == 3:
        fields.append("")
    if len(fields) != 4:
        raise ValueError(f"not a mooncake endpoint address: {address!r}")
    protocol, base, session, incarnation = fields
    return protocol, session, int(base), incarnation


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
