"""`nixl`: one-sided reads and writes into a daemon's DRAM segments through NVIDIA's NIXL
(Inference Xfer Library), over whichever of its backends the agents share (UCX on any host; on
others LIBFABRIC, GPUNETIO). This module holds what both sides share: the agent's start-up, the
endpoint address, and waiting on a transfer; the sides are nixl_client.py and nixl_server.py.

The daemon's agent registers each DRAM segment once, at mount, and advertises

    "v1|<agent name>|<segment base address>|<base64 of the agent's partial metadata>"

where the metadata (NIXL's own serialisation: the agent's connection info and that one segment's
registration, ~450 bytes on UCX over tcp) is what a peer loads with add_remote_agent. The
metadata service is the out-of-band channel NIXL asks for: no listener, no extra port, no
handshake round trip. An agent's name is unique per start (host, pid, random bits), so a client
never reaches a restarted daemon through a dead one's connection or registrations.

Trust boundary, as for mooncake: a transfer is one-sided, so no daemon code runs per request and
the daemon checks no grant. The client confines itself to its granted ranges and refuses expired
grants; NIXL on the client refuses a descriptor outside the daemon's registered memory (so a
client that goes through kvstore cannot reach anything but segment memory). A peer that talks
UCX directly to the daemon's worker is bound only by what UCX enforces for its transport (the
NIC checks the rkey's bounds on RDMA; over tcp the daemon's UCX serves remote reads in software,
which was not audited here). Offer this transport only on a trusted network.
"""

from __future__ import annotations

import base64
import importlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kvstore.errors import TransportError, Unavailable

os.environ.setdefault("NIXL_LOG_LEVEL", "ERROR")  # read at import: else every agent start logs at INFO


def _import_nixl() -> Any:
    """The NIXL API: the CUDA 12 wheel (`pip install nixl-cu12`), else whichever the `nixl` meta
    package picked; ImportError naming the first if neither is installed."""
    try:
        return importlib.import_module("nixl_cu12")
    except ImportError as first:
        try:
            return importlib.import_module("nixl")
        except ImportError:
            raise first from None


nixl = _import_nixl()

ADDRESS_VERSION = "v1"
DEFAULT_BACKENDS = ("UCX",)
_POLL_SPINS = 200  # state checks before a waiting call starts to sleep between them
_POLL_SLEEP_S = 0.0002
_ENV_LOCK = threading.Lock()
# The daemon agent's progress thread sleeps this long when idle: 0 (the wrapper's) spins a core.
PROGRESS_DELAY_US = 100


class Peer(NamedTuple):
    """A daemon agent as an endpoint address names it."""

    agent: str
    base: int  # the segment's address in the daemon's memory
    metadata: bytes  # partial agent metadata: connection info and this segment's registration


def _rdma_devices_present() -> bool:
    path = Path("/sys/class/infiniband")
    return path.is_dir() and any(path.iterdir())


def _progress_delay_config(delay_us: int) -> Any:
    """NIXL's agent config class with its progress thread's delay pinned to `delay_us`: the Python
    wrapper sets it to 0, where the thread spins (sched_yield) and takes a whole core while idle.
    The class as it is where the binding does not expose the delay as a property."""
    base = nixl._api.nixlBind.nixlAgentConfig
    field = base.__dict__.get("pthrDelay")
    if not isinstance(field, property):
        return base

    class DelayedConfig(base):  # type: ignore[misc, valid-type]
        @property
        def pthrDelay(self) -> int:  # the binding's name
            return int(field.__get__(self))

        @pthrDelay.setter
        def pthrDelay(self, _ignored: int) -> None:
            field.__set__(self, delay_us)

    return DelayedConfig


def start_agent(role: str, backends: Sequence[str], ucx_tls: str, progress_thread: bool) -> Any:
    """A NIXL agent named uniquely for this start, with `backends` (those NIXL has no plugin for
    are skipped; none left is Unavailable). UCX_TLS, unless set in the environment, is `ucx_tls`.

    On a host without RDMA devices UCX's ib module is left out (UCX_MODULES=^ib unless set): it
    adds nothing there, and the libnl-route it loads crashed every process that had started a UCX
    backend at exit (SIGSEGV in rtnl_tc_unregister, measured here with nixl-cu12 1.5.1)."""
    name = f"kvstore-{role}-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    env = {"UCX_TLS": ucx_tls, "UCX_WARN_UNUSED_ENV_VARS": "n"}
    if not _rdma_devices_present():
        env["UCX_MODULES"] = "^ib"
    config = nixl.nixl_agent_config(
        enable_prog_thread=progress_thread,
        backends=list(backends),
        sync_mode=nixl.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
    )
    binding = nixl._api.nixlBind
    with _ENV_LOCK:  # UCX reads its environment when the backend starts
        added = [k for k in env if k not in os.environ]
        os.environ.update({k: env[k] for k in added})
        binding.nixlAgentConfig, plain = _progress_delay_config(PROGRESS_DELAY_US), binding.nixlAgentConfig
        try:
            agent = nixl.nixl_agent(name, config)
        except Exception as exc:  # NIXL raises its own types (and RuntimeError)
            raise Unavailable(f"nixl: the agent did not start with backends {list(backends)}: {exc}") from exc
        finally:
            binding.nixlAgentConfig = plain
            for k in added:
                os.environ.pop(k, None)
    if not agent.backends:
        raise Unavailable(
            f"nixl: none of the backends {list(backends)} has a plugin here (available: {agent.get_plugin_list()})"
        )
    return agent


def format_address(agent: str, base: int, metadata: bytes) -> str:
    return f"{ADDRESS_VERSION}|{agent}|{base}|{base64.b64encode(metadata).decode()}"


def parse_address(address: str) -> Peer:
    fields = address.split("|")
    if len(fields) != 4 or fields[0] != ADDRESS_VERSION:
        raise ValueError(f"not a nixl {ADDRESS_VERSION} endpoint address: {address[:80]!r}")
    _, agent, base, metadata = fields
    return Peer(agent, int(base), base64.b64decode(metadata, validate=True))


def descs(agent: Any, ranges: Any) -> Any:
    """A NIXL transfer descriptor list of DRAM (address, length, device 0) rows."""
    return agent.get_xfer_descs(ranges, "DRAM")


class Outcome(NamedTuple):
    """How a transfer ended: `done`, or why not; `settled` is False when NIXL could not cancel it
    (its local memory may still be touched); `refused` when NIXL refused to post it at all (a
    range outside the peer's registered memory, or metadata not loaded)."""

    done: bool
    settled: bool
    why: str
    refused: bool = False


def run_transfer(agent: Any, op: str, local: Any, remote: Any, peer: str, deadline: float) -> Outcome:
    """Post one transfer and wait for it until `deadline` (time.monotonic()); the handle is
    always released, cancelling the transfer if it is still going."""
    try:
        handle = agent.initialize_xfer(op, local, remote, peer)
    except Exception as exc:  # noqa: BLE001 - NIXL's error types carry only a status name
        return Outcome(False, True, f"NIXL refused the transfer ({exc}): its ranges are not registered memory", True)
    why = ""
    try:
        state = agent.transfer(handle)
        spins = 0
        while state == "PROC":
            if time.monotonic() >= deadline:
                why = "the deadline passed"
                break
            spins += 1
            if spins > _POLL_SPINS:
                time.sleep(_POLL_SLEEP_S)
            state = agent.check_xfer_state(handle)
        if state == "ERR":
            why = "NIXL reported an error (the daemon's agent may have stopped)"
    except Exception as exc:  # noqa: BLE001
        why = f"NIXL failed: {exc}"
    try:
        handle.release()
    except Exception:  # noqa: BLE001 - still active: NIXL keeps the handle, and the memory in use
        return Outcome(False, False, why or "the transfer could not be released")
    return Outcome(not why, True, why)


def wrap(what: str, exc: BaseException) -> TransportError:
    return TransportError(f"nixl: {what}: {exc}")
