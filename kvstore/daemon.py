"""The storage daemon: owns segments, serves them over the data-plane transports, and keeps the
metadata service told that it is alive."""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from pathlib import Path

import grpc

from kvstore import wire
from kvstore.config import DaemonConfig, resolve_secret
from kvstore.errors import Unavailable, from_rpc_error
from kvstore.grant import GrantSigner
from kvstore.hostid import pid_alive
from kvstore.mover import TierMover
from kvstore.storage.base import SegmentStorage
from kvstore.storage.dram import DramSegment
from kvstore.transport import registry
from kvstore.transport.base import GrantChecker, TransportServer
from kvstore.types import SegmentInfo
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
_SHM_FILE = re.compile(r"^kvstore-(\d+)-")


def sweep_stale_segments(shm_dir: str) -> int:
    """Delete segment files left by daemons that were killed (their pid is gone)."""
    removed = 0
    for path in Path(shm_dir).glob("kvstore-*"):
        m = _SHM_FILE.match(path.name)
        if m and not pid_alive(int(m.group(1))):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


class StorageDaemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.daemon_id = config.daemon_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        secret, insecure = resolve_secret(config.secret)
        if insecure:
            log.warning("no secret configured: using the insecure development secret "
                        "(set KVSTORE_DAEMON_SECRET / --secret to the metadata service's secret)")
        self._checker = GrantChecker(GrantSigner(secret), self.segment)
        self._segments: dict[str, SegmentStorage] = {}
        self._servers: list[TransportServer] = []
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="daemon-heartbeat", daemon=True)
        self._channel = grpc.insecure_channel(config.meta_address)
        self._meta = pb_grpc.MetaServiceStub(self._channel)
        self._recovered: dict[str, list] = {}
        self._ssd_lock: int | None = None
        self._mover: TierMover | None = None

    def segment(self, segment_id: str) -> SegmentStorage | None:
        return self._segments.get(segment_id)

    @property
    def servers(self) -> list[TransportServer]:
        return list(self._servers)

    def start(self, mount_timeout_s: float = 30.0) -> "StorageDaemon":
        """Create segments, start transports, mount with the metadata service, start heartbeats."""
        swept = sweep_stale_segments(self.config.shm_dir)
        if swept:
            log.info("removed %d segment files left by killed daemons", swept)
        try:
            for i, size in enumerate(self.config.segment_sizes):
                seg = DramSegment(f"{self.daemon_id}-dram{i}", size, self.config.shm_dir)
                self._segments[seg.segment_id] = seg
            self._open_ssd()
            if self.config.gpu_size:
                from kvstore.storage.gpu import GpuSegment

                seg = GpuSegment(f"{self.daemon_id}-gpu0", self.config.gpu_size, self.config.gpu_device)
                self._segments[seg.segment_id] = seg
            self._start_servers()
            self._mount_all(time.monotonic() + mount_timeout_s)
        except BaseException:
            self._release()
            raise
        self._heartbeat.start()
        if self.config.ssd_dir:
            self._mover = TierMover(self.daemon_id, self._meta, self.segment, self.config.move_poll_s,
                                    self.config.move_batch_bytes)
            self._mover.start()
        log.info("daemon %s serving %d segments (%d bytes) over %s", self.daemon_id, len(self._segments),
                 sum(s.capacity for s in self._segments.values()), ", ".join(s.name for s in self._servers))
        return self

    def _start_servers(self) -> None:
        """Start each configured transport whose library is installed (an optional one that is
        not is skipped with a warning naming its extra), and give it every segment."""
        for name in self.config.transports:
            try:
                cls = registry.server_class(name)
            except Unavailable as exc:
                log.warning("not serving %s: %s", name, exc)
                continue
            server = cls(self._checker, self.config)
            server.start()
            self._servers.append(server)          # stopped by _release() if anything below fails
            for seg in self._segments.values():
                server.add_segment(seg)
        if not self._servers:
            raise Unavailable(f"none of the transports {', '.join(self.config.transports)} can be served here")

    def endpoints(self) -> dict[str, str]:
        """transport name -> address of its first segment's endpoint, for humans."""
        found: dict[str, str] = {}
        for seg in self._segments.values():
            for ep in self.info(seg).endpoints:
                found.setdefault(ep.transport, ep.address)
        return found

    def info(self, seg: SegmentStorage) -> SegmentInfo:
        endpoints = tuple(ep for server in self._servers if (ep := server.endpoint(seg)) is not None)
        return SegmentInfo(seg.segment_id, self.daemon_id, seg.tier, seg.capacity, endpoints)

    def _open_ssd(self) -> None:
        """Open (or create) the SSD segments and find which blocks survived the last run."""
        if not self.config.ssd_dir:
            return
        import fcntl

        from kvstore.storage.ssd import SsdSegment

        directory = Path(self.config.ssd_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self._ssd_lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._ssd_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Unavailable(f"SSD directory {directory} is in use by another daemon; "
                              "give each daemon its own --ssd-dir") from None
        for i, size in enumerate(self.config.ssd_segment_sizes):
            seg = SsdSegment.open(directory, i, size)
            self._segments[seg.segment_id] = seg
            report = seg.recover()
            self._recovered[seg.segment_id] = report.blocks
            if report.blocks or report.dropped:
                log.info("%s: %d blocks recovered, %d dropped as corrupt", seg.segment_id,
                         len(report.blocks), len(report.dropped))

    def _mount_all(self, deadline: float) -> None:
        for seg in self._segments.values():
            self._mount(seg, deadline)
        for segment_id, blocks in self._recovered.items():
            self._announce(segment_id, blocks)
        self._recovered.clear()

    def _announce(self, segment_id: str, blocks: list) -> None:
        for start in range(0, len(blocks), 1000):
            batch = blocks[start:start + 1000]
            self._meta.AnnounceBlocks(pb.AnnounceBlocksRequest(segment_id=segment_id, blocks=[
                pb.AnnouncedBlock(key=b.key, offset=b.offset, size=b.size, checksum=b.checksum) for b in batch]),
                timeout=30)

    def _mount(self, seg: SegmentStorage, deadline: float) -> None:
        request = pb.MountSegmentRequest(segment=wire.segment_to_pb(self.info(seg)))
        while True:
            try:
                self._meta.MountSegment(request, timeout=max(0.1, deadline - time.monotonic()),
                                        wait_for_ready=True)
                return
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                        or time.monotonic() >= deadline:
                    raise from_rpc_error(exc, f"mounting segment {seg.segment_id} at "
                                              f"{self.config.meta_address}") from exc

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_s
        while not self._stop.wait(interval):
            try:
                resp = self._meta.Heartbeat(pb.HeartbeatRequest(daemon_id=self.daemon_id,
                                                                segment_ids=list(self._segments)),
                                            timeout=max(1.0, interval))
                for segment_id in resp.unknown_segment_ids:
                    # The service restarted or gave us up for dead: offer the segment afresh, and
                    # what a persistent segment still holds.
                    log.warning("metadata service does not know segment %s: mounting it again", segment_id)
                    seg = self._segments[segment_id]
                    self._mount(seg, time.monotonic() + interval)
                    if seg.persistent:
                        self._announce(segment_id, seg.recover().blocks)
            except (grpc.RpcError, Unavailable) as exc:
                log.warning("heartbeat to %s failed: %s", self.config.meta_address, exc)

    def stop(self) -> None:
        """Unmount (best effort), stop serving, and delete the segment files."""
        self._stop.set()
        if self._mover is not None:
            self._mover.stop()
        if self._heartbeat.is_alive():
            self._heartbeat.join(timeout=5)
        for segment_id in self._segments:
            try:
                self._meta.UnmountSegment(pb.UnmountSegmentRequest(segment_id=segment_id), timeout=2)
            except grpc.RpcError as exc:
                log.warning("could not unmount %s: %s", segment_id, exc.code().name)
        self._release()

    def _release(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers.clear()
        for seg in self._segments.values():
            seg.close(remove=not seg.persistent)     # SSD blocks are kept for the next start
        self._segments.clear()
        if self._ssd_lock is not None:
            os.close(self._ssd_lock)
            self._ssd_lock = None
        self._channel.close()
