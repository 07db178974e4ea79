"""`mooncake`: one-sided reads and writes into a daemon's DRAM segments through the Mooncake
Transfer Engine (protocol `tcp` on any host; `rdma`, with device names, in production).

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

import ctypes
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Bounds on a hung or dead peer, read when an engine is created: without them a transfer to a
# stopped daemon blocks for 30 s. 5 s is the least MC_TRANSFER_TIMEOUT the binding accepts.
for _name, _value in (("MC_TCP_PROGRESS_TIMEOUT_SEC", "2"), ("MC_TCP_STATUS_TIMEOUT_SEC", "2"),
                      ("MC_TRANSFER_TIMEOUT", "5"), ("MC_LOG_LEVEL", "ERROR")):
    os.environ.setdefault(_name, _value)

from mooncake.engine import TransferEngine  # noqa: E402  (after the environment it reads)

from kvstore.checksum import hasher  # noqa: E402
from kvstore.config import ClientConfig, DaemonConfig  # noqa: E402
from kvstore.errors import InvalidArgument, PermissionDenied, TransportError, Unavailable  # noqa: E402
from kvstore.storage.base import SegmentStorage  # noqa: E402
from kvstore.transport.base import GrantChecker, Transfer, Transport, TransportServer  # noqa: E402
from kvstore.transport import mooncake_staging  # noqa: E402
from kvstore.types import Endpoint, GrantMode, SegmentInfo, Tier  # noqa: E402

_MAX_ENTRIES = 4096            # transfers per engine call
# Blocks go to the engine in pieces of at most this: it moves a batch's entries in parallel, and
# measured here (tcp) 1 MiB moved as 2 x 512 KiB at 3.5 GB/s, as one entry at 1.1 GB/s.
_ENTRY = 512 << 10
_DEAD_FOR_S = 2.0              # a daemon found gone after a failed call is not tried for this long
_HASH_PIECE = 1 << 20          # copied and hashed together, while in cache
# Every sync call busy-polls a core until it completes, and more concurrent calls do not move more
# bytes; past this many, calls wait their turn (bounded by their deadline).
_CALLS = threading.BoundedSemaphore(max(1, min(4, (os.cpu_count() or 2) // 2)))


def _start_engine(host: str, protocol: str, device: str) -> TransferEngine:
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", protocol, device)
    if rc != 0:
        raise Unavailable(f"the Mooncake Transfer Engine did not start on {host} over {protocol} "
                          f"(devices {device or 'auto'}; rc {rc}); check the protocol and device names")
    return engine


def _advertised_host(host: str) -> str:
    return socket.gethostname() if host in ("", "0.0.0.0", "::") else host


def _parse(address: str) -> tuple[str, str, int]:
    """(protocol, session, segment base address) of an endpoint address."""
    protocol, base, session = address.split("|", 2)
    return protocol, session, int(base)


def _local_host_towards(session: str) -> str:
    """This host's address on the route to `session` (what the peer would see us as)."""
    host = session.rpartition(":")[0].strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))            # UDP: picks a route, sends nothing
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _listening(session: str, timeout: float = 0.5) -> bool | None:
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


class _PeerGone(TransportError):
    """A transfer failed because the daemon's engine no longer exists."""


# --- server -------------------------------------------------------------------------------------

@dataclass
class _Region:
    """A registered segment: its base address, and the objects that keep the mapping exported."""

    base: int
    view: memoryview
    anchor: ctypes.c_char

    def release(self) -> None:
        del self.anchor                  # drop the export first, or the view cannot be released
        self.view.release()


class MooncakeServer(TransportServer):
    """Owns one engine; registers every DRAM segment with it. Serves nothing per request, so the
    grant checker is unused (see the module's trust boundary)."""

    name = "mooncake"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        self._host = _advertised_host(config.host)
        self._protocol = config.mooncake_protocol
        self._device = config.mooncake_device
        self._engine: TransferEngine | None = None
        self._session = ""
        self._regions: dict[str, _Region] = {}

    def start(self) -> None:
        self._engine = _start_engine(self._host, self._protocol, self._device)
        self._session = f"{self._host}:{self._engine.get_rpc_port()}"

    def add_segment(self, segment: SegmentStorage) -> None:
        if segment.tier is not Tier.DRAM or segment.segment_id in self._regions:
            return
        if self._engine is None:
            raise TransportError("mooncake: add_segment before start")
        view = segment.view(0, segment.capacity)
        anchor = ctypes.c_char.from_buffer(view)
        region = _Region(ctypes.addressof(anchor), view, anchor)
        rc = self._engine.register_memory(region.base, segment.capacity)
        if rc != 0:
            region.release()
            raise TransportError(f"mooncake: registering segment {segment.segment_id} "
                                 f"({segment.capacity} bytes) failed with rc {rc}")
        self._regions[segment.segment_id] = region

    def endpoint(self, segment: SegmentStorage) -> Endpoint | None:
        region = self._regions.get(segment.segment_id)
        if region is None:
            return None
        return Endpoint(self.name, f"{self._protocol}|{region.base}|{self._session}")

    def stop(self) -> None:
        """Unregister every segment and shut the engine (its ports close with it)."""
        for region in self._regions.values():
            if self._engine is not None:
                self._engine.unregister_memory(region.base)
            region.release()
        self._regions.clear()
        self._engine = None


# --- client -------------------------------------------------------------------------------------

class _Engines:
    """The client side's engine, one per process (each engine holds two ports and a thread pool),
    started on first use with the protocol of the first endpoint reached."""

    _lock = threading.Lock()
    _engine: TransferEngine | None = None
    _protocol = ""

    @classmethod
    def get(cls, protocol: str, device: str, session: str) -> TransferEngine:
        with cls._lock:
            if cls._engine is None:
                cls._engine = _start_engine(_local_host_towards(session), protocol, device)
                cls._protocol = protocol
            elif protocol != cls._protocol:
                raise TransportError(f"this process's Mooncake engine speaks {cls._protocol}, "
                                     f"the segment {protocol}")
            return cls._engine

    @classmethod
    def speaks(cls, protocol: str) -> bool:
        return cls._engine is None or cls._protocol == protocol


@dataclass(frozen=True)
class _Piece:
    """Part of one transfer that fits a staging round."""

    transfer: int                   # index of its Transfer
    local: memoryview               # the caller's bytes
    remote: int                     # address in the daemon's segment


class MooncakeTransport(Transport):
    """Moves bytes through registered staging memory (see mooncake_staging), in rounds of at most 64 MiB,
    each one engine batch call (entries chunked at 4096); the copy in or out of staging computes
    each block's checksum, so the client does not read the bytes again."""

    name = "mooncake"

    def __init__(self, config: ClientConfig | None = None) -> None:
        self._device = (config or ClientConfig()).mooncake_device
        self._dead: dict[str, float] = {}             # session -> monotonic time to retry at
        self._lock = threading.Lock()
        self._engine: TransferEngine | None = None
        self._staging: mooncake_staging.Staging | None = None

    @classmethod
    def from_config(cls, config: ClientConfig) -> "MooncakeTransport":
        return cls(config)

    def can_reach(self, segment: SegmentInfo) -> bool:
        ep = segment.endpoint(self.name)
        if ep is None:
            return False
        try:
            protocol, _, _ = _parse(ep.address)
        except ValueError:
            return False
        return _Engines.speaks(protocol)

    def write(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.WRITE, deadline)

    def read(self, segment: SegmentInfo, transfers: Sequence[Transfer], deadline: float) -> list[int]:
        return self._move(segment, transfers, GrantMode.READ, deadline)

    def _move(self, segment: SegmentInfo, transfers: Sequence[Transfer], mode: GrantMode,
              deadline: float) -> list[int]:
        ep = segment.endpoint(self.name)
        if ep is None:
            raise TransportError(f"segment {segment.segment_id} offers no mooncake endpoint")
        protocol, session, base = _parse(ep.address)
        views = [_checked_view(segment, t, mode) for t in transfers]
        with self._lock:
            retry_at = self._dead.get(session)
        if retry_at is not None and time.monotonic() < retry_at:
            raise TransportError(f"the daemon of segment {segment.segment_id} ({session}) did not answer "
                                 "a moment ago; it may have stopped")
        engine, staging = self._engine_for(protocol, session)
        pieces = deque(_Piece(i, view[k:k + mooncake_staging.STAGING_BYTES], base + t.grant.offset + k)
                       for i, (t, view) in enumerate(zip(transfers, views))
                       for k in range(0, view.nbytes, mooncake_staging.STAGING_BYTES))
        hashes = [hasher() for _ in transfers]
        buf = staging.take(engine)
        clean = False
        try:
            while pieces:
                round_, used = [], 0
                while pieces and used + pieces[0].local.nbytes <= mooncake_staging.STAGING_BYTES:
                    round_.append((pieces.popleft(), used))
                    used += round_[-1][0].local.nbytes
                self._round(engine, session, mode, round_, buf, hashes, segment, deadline)
            clean = True
        except _PeerGone:
            clean = True                 # a dead daemon sends nothing more: the buffer is safe
            raise
        finally:
            staging.give_back(buf, clean)
        return [h.intdigest() for h in hashes]

    def _round(self, engine: TransferEngine, session: str, mode: GrantMode, round_: list[tuple[_Piece, int]],
               buf: np.ndarray, hashes: list, segment: SegmentInfo, deadline: float) -> None:
        """Move one staging buffer's worth: copy in (write), engine calls, copy out (read)."""
        stage, base = memoryview(buf), buf.ctypes.data
        if mode is GrantMode.WRITE:
            for piece, at in round_:
                _copy_hashing(stage[at:at + piece.local.nbytes], piece.local, hashes[piece.transfer])
        entries = [(base + at + k, piece.remote + k, min(_ENTRY, piece.local.nbytes - k))
                   for piece, at in round_ for k in range(0, piece.local.nbytes, _ENTRY)]
        for start in range(0, len(entries), _MAX_ENTRIES):
            local, remote, lengths = zip(*entries[start:start + _MAX_ENTRIES])
            self._call(engine, session, mode, list(local), list(remote), list(lengths), segment, deadline)
        if mode is GrantMode.READ:
            for piece, at in round_:
                _copy_hashing(piece.local, stage[at:at + piece.local.nbytes], hashes[piece.transfer])

    def _engine_for(self, protocol: str, session: str) -> tuple[TransferEngine, mooncake_staging.Staging]:
        engine = _Engines.get(protocol, self._device, session)
        with self._lock:
            if self._engine is None:
                self._engine, self._staging = engine, mooncake_staging.Staging(register=protocol != "tcp")
            return engine, self._staging

    def _call(self, engine: TransferEngine, session: str, mode: GrantMode, local: list[int],
              remote: list[int], lengths: list[int], segment: SegmentInfo, deadline: float) -> None:
        """One batch call, or TransportError; a daemon whose RPC port then refuses (or does not
        answer) is not tried again for _DEAD_FOR_S, so calls to a dead daemon fail at once."""
        if not local:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not _CALLS.acquire(timeout=remaining):
            raise TransportError(f"mooncake {mode.name.lower()} of segment {segment.segment_id}: "
                                 "the deadline passed")
        try:
            if mode is GrantMode.WRITE:
                rc = engine.batch_transfer_sync_write(session, local, remote, lengths)
            else:
                rc = engine.batch_transfer_sync_read(session, local, remote, lengths)
        finally:
            _CALLS.release()
        if rc == 0:
            return
        listening = _listening(session)
        if not listening:
            with self._lock:
                self._dead[session] = time.monotonic() + _DEAD_FOR_S
        if listening is None:
            raise TransportError(f"mooncake {mode.name.lower()} of {len(local)} pieces in segment "
                                 f"{segment.segment_id} failed: {session} does not answer")
        if listening is False:
            raise _PeerGone(f"mooncake {mode.name.lower()} of {len(local)} pieces in segment "
                            f"{segment.segment_id} failed: nothing listens at {session} any more; "
                            "its daemon has stopped")
        raise TransportError(f"mooncake {mode.name.lower()} of {len(local)} pieces in segment "
                             f"{segment.segment_id} at {session} failed (rc {rc}): the daemon is hung "
                             "or overloaded, or refused the range (segment unmounted?)")

    def forget(self, segment_id: str) -> None:
        """Nothing per segment: the engine caches sessions itself, and a restarted daemon comes
        back under a new session name."""

    def close(self) -> None:
        """Release idle staging memory; the process-wide engine stays for other clients."""
        with self._lock:
            if self._staging is not None:
                self._staging.release(self._engine)


def _copy_hashing(dst: memoryview, src: memoryview, h) -> None:
    """dst[:] = src, feeding src to the hasher a cache-sized piece at a time, right after its copy."""
    for k in range(0, src.nbytes, _HASH_PIECE):
        dst[k:k + _HASH_PIECE] = src[k:k + _HASH_PIECE]
        h.update(dst[k:k + _HASH_PIECE])


def _checked_view(segment: SegmentInfo, t: Transfer, mode: GrantMode) -> memoryview:
    """t.buffer as flat bytes after the checks the daemon cannot make: grant for this segment and
    direction, range inside it, buffer the grant's size, grant not expired."""
    g, buf = t.grant, t.buffer
    if g.segment_id != segment.segment_id or g.mode != mode:
        raise InvalidArgument(f"grant for {g.segment_id}/{g.mode.name} used for "
                              f"{segment.segment_id}/{mode.name}")
    if not buf.c_contiguous or (mode is GrantMode.READ and buf.readonly):
        raise InvalidArgument("mooncake transfers need C-contiguous buffers, writable for a read")
    if buf.nbytes != g.length or g.offset + g.length > segment.capacity:
        raise InvalidArgument(f"buffer of {buf.nbytes} bytes does not match grant [{g.offset}, +{g.length}) "
                              f"in a {segment.capacity}-byte segment")
    if g.expires_ms < int(time.time() * 1000):
        # The space may already belong to another key: writing could corrupt it, reading return it.
        raise PermissionDenied(f"{mode.name.lower()} grant expired: {'put' if mode is GrantMode.WRITE else 'get'} again")
    return buf.cast("B")
