"""The storage daemon: owns segments, serves them over the data-plane transports, and keeps the
metadata service told that it is alive."""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kvstore.admin.http import AdminServer
from kvstore.config import DaemonConfig, resolve_secret, split_sizes
from kvstore.daemon.link import ShardLink
from kvstore.errors import Unavailable
from kvstore.grant import GrantSigner
from kvstore.hostid import host_id, pid_alive
from kvstore.metaclient.client import MetaClient
from kvstore.observe import METRICS_ENDPOINT, NO_TRANSFERS
from kvstore.storage.base import Persistent, SegmentStorage
from kvstore.storage.dram import DramSegment
from kvstore.tls import TlsFiles
from kvstore.transport import registry
from kvstore.transport.base import GrantChecker, TransportServer
from kvstore.types import Endpoint, SegmentInfo
from kvstore.wire.calls import ServiceInfo

if TYPE_CHECKING:
    from kvstore.metrics.daemon import DaemonMetrics

log = logging.getLogger(__name__)
_SHM_FILE = re.compile(r"^kvstore-(\d+)-")
_COPY_POLL_S = 0.5  # how often a daemon without an SSD tier asks for copy tasks


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
        # DRAM and GPU segments die with this process: their ids are new in every run, also under a
        # configured daemon_id, so that a restarted daemon never confirms the service's record of
        # memory it no longer holds (a segment set aside while its daemon was silent: upkeep.py).
        self._memory_id = f"{config.daemon_id}-{secrets.token_hex(3)}" if config.daemon_id else self.daemon_id
        secret, insecure = resolve_secret(config.secret)
        if insecure:
            log.warning(
                "no secret configured: using the insecure development secret "
                "(set KVSTORE_SECRET / --secret to the metadata service's secret)"
            )
        self.metrics: DaemonMetrics | None = None
        self._admin: AdminServer | None = None
        if config.metrics_port >= 0:
            from kvstore.metrics.daemon import DaemonMetrics

            self.metrics = DaemonMetrics(self.daemon_id, lambda: list(self._segments.values()), self._connections)
            self._admin = AdminServer(config.metrics_host, config.metrics_port)
            self.metrics.mount(self._admin)
        signer = GrantSigner(secret)
        self._checker = GrantChecker(signer, self.segment, observer=self.metrics or NO_TRANSFERS)
        self._segments: dict[str, SegmentStorage] = {}
        self._servers: list[TransportServer] = []
        # TLS to the service when told its CA; its certificate is then this daemon's identity too.
        tls = TlsFiles(config.tls_cert, config.tls_key, config.tls_ca) if config.tls_ca else TlsFiles()
        self._meta = MetaClient(config.meta_address, timeout_s=10.0, token=signer.daemon_token, tls=tls)
        self._links: list[ShardLink] = []  # one per metadata shard
        self._ssd_lock: int | None = None

    def segment(self, segment_id: str) -> SegmentStorage | None:
        return self._segments.get(segment_id)

    @property
    def servers(self) -> list[TransportServer]:
        return list(self._servers)

    def start(self, mount_timeout_s: float = 30.0) -> StorageDaemon:
        """Find the metadata shards, create each one's segments, start transports, mount, start
        heartbeats and movers."""
        swept = sweep_stale_segments(self.config.shm_dir)
        if swept:
            log.info("removed %d segment files left by killed daemons", swept)
        deadline = time.monotonic() + mount_timeout_s
        try:
            self._links = self._link_shards(deadline)
            for link in self._links:
                self._make_segments(link, len(self._links))
            if self._admin is not None:
                self._admin.start()
            self._start_servers()
            for link in self._links:
                link.mount_all(deadline)
        except BaseException:
            self._release()
            raise
        # Every daemon takes copy tasks (replacing lost replicas); one with SSD or GPU also tier
        # moves, which want a quicker poll.
        moves = self.config.ssd_dir or self.config.gpu_size
        poll = self.config.move_poll_s if moves else max(self.config.move_poll_s, _COPY_POLL_S)
        for link in self._links:
            link.start(self.segment, poll, self.config.move_batch_bytes)
        log.info(
            "daemon %s serving %d segments (%d bytes) to %d metadata shard(s) over %s",
            self.daemon_id,
            len(self._segments),
            sum(s.capacity for s in self._segments.values()),
            len(self._links),
            ", ".join(s.name for s in self._servers),
        )
        return self

    def _link_shards(self, deadline: float) -> list[ShardLink]:
        """A link per shard of the store the configured service belongs to (asking it, while it
        is not up yet, until `deadline`)."""
        while True:
            try:
                info = self._meta.call(ServiceInfo())
                if info.shards is not None and (missing := info.shards.missing(info.shard)):
                    raise Unavailable(
                        f"the shard map of {self.config.meta_address} has no address for shard(s) {missing} yet"
                    )
                break
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)  # the service is starting: its readiness is what we wait for
        interval = self.config.heartbeat_interval_s
        if info.shards is None or info.shards.count == 1:
            return [ShardLink(0, self.daemon_id, self._meta, self.info, interval)]
        links = []
        for i, address in enumerate(info.shards.addresses):
            meta = self._meta if i == info.shard else self._meta.like(address, i)
            links.append(ShardLink(i, self.daemon_id, meta, self.info, interval))
        return links

    def _make_segments(self, link: ShardLink, shards: int) -> None:
        """Shard `link.shard`'s slice of every tier: 1/shards of each."""
        cfg = self.config
        tag = f"-s{link.shard}" if shards > 1 else ""
        made: list[SegmentStorage] = []
        for i, size in enumerate(split_sizes(cfg.dram_size // shards, cfg.segment_size)):
            made.append(DramSegment(f"{self._memory_id}{tag}-dram{i}", size, cfg.shm_dir, cfg.map_dram_pages))
        if cfg.ssd_dir:
            made.extend(self._open_ssd(link, shards))
        if cfg.gpu_size:
            from kvstore.storage.gpu import GpuSegment

            made.append(GpuSegment(f"{self._memory_id}{tag}-gpu0", cfg.gpu_size // shards, cfg.gpu_device))
        for seg in made:
            self._segments[seg.segment_id] = seg
            link.segments[seg.segment_id] = seg

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
            if self.metrics is not None:
                server.observer = self.metrics
            server.start()
            self._servers.append(server)  # stopped by _release() if anything below fails
            for seg in self._segments.values():
                server.add_segment(seg)
        if not self._servers:
            raise Unavailable(f"none of the transports {', '.join(self.config.transports)} can be served here")

    def endpoints(self) -> dict[str, str]:
        """transport name -> address of its first segment's endpoint, for humans."""
        found: dict[str, str] = {}
        for seg in self._segments.values():
            for ep in self.info(seg).endpoints:
                if ep.transport != METRICS_ENDPOINT:
                    found.setdefault(ep.transport, ep.address)
        return found

    def info(self, seg: SegmentStorage) -> SegmentInfo:
        endpoints = tuple(ep for server in self._servers if (ep := server.endpoint(seg)) is not None)
        if self._admin is not None:  # not a transport: where the service's dashboard reads this daemon's metrics
            endpoints += (Endpoint(METRICS_ENDPOINT, f"http://{self._admin.address}"),)
        return SegmentInfo(seg.segment_id, self.daemon_id, seg.tier, seg.capacity, endpoints, host_id())

    @property
    def metrics_address(self) -> str:
        """host:port of this daemon's /metrics, or "" when it has none."""
        return self._admin.address if self._admin is not None else ""

    def _connections(self) -> dict[str, int]:
        return {s.name: n for s in self._servers if isinstance(n := getattr(s, "connections", None), int)}

    def _open_ssd(self, link: ShardLink, shards: int) -> list[SegmentStorage]:
        """Open (or create) shard `link.shard`'s SSD segments and find which blocks survived the
        last run (segment files are numbered across shards: the same shard count finds its own)."""
        import fcntl

        from kvstore.storage.ssd import SsdSegment

        directory = Path(self.config.ssd_dir)
        if self._ssd_lock is None:
            directory.mkdir(parents=True, exist_ok=True)
            self._ssd_lock = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(self._ssd_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise Unavailable(
                    f"SSD directory {directory} is in use by another daemon; give each daemon its own --ssd-dir"
                ) from None
        sizes = split_sizes(self.config.ssd_size // shards, self.config.ssd_segment_size)
        opened: list[SegmentStorage] = []
        for j, size in enumerate(sizes):
            try:
                seg = SsdSegment.open(directory, link.shard * len(sizes) + j, size)
            except ValueError as exc:
                raise Unavailable(
                    f"{directory}: {exc} (was it made for another shard count or size? see docs/sharding.md)"
                ) from exc
            seg.io = self.metrics
            opened.append(seg)
            report = seg.recover()
            link.recovered[seg.segment_id] = report.blocks
            if report.blocks or report.dropped:
                log.info(
                    "%s: %d blocks recovered, %d dropped as corrupt",
                    seg.segment_id,
                    len(report.blocks),
                    len(report.dropped),
                )
        return opened

    def stop(self) -> None:
        """Unmount (best effort), stop serving, and delete the segment files."""
        for link in self._links:
            link.stop()
        self._release()

    def _release(self) -> None:
        if self._admin is not None:
            self._admin.stop()
            self._admin = None
        for server in self._servers:
            server.stop()
        self._servers.clear()
        for seg in self._segments.values():
            seg.close(remove=not isinstance(seg, Persistent))  # SSD blocks are kept for the next start
        self._segments.clear()
        if self._ssd_lock is not None:
            os.close(self._ssd_lock)
            self._ssd_lock = None
        for link in self._links:
            if link.meta is not self._meta:
                link.meta.close()
        self._meta.close()
