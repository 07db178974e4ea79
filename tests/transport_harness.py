"""What the transport unit tests share: a daemon in the test's own process (a DRAM segment, a
segment without view(), the signer and the grant checker) around any TransportServer, and put/get
of one block through a client transport."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Generic, TypeVar

from kvstore.checksum import checksum
from kvstore.clock import Clock, SystemClock, now_ms
from kvstore.config import DaemonConfig
from kvstore.grant import GrantSigner
from kvstore.storage.base import SegmentStorage
from kvstore.storage.dram import DramSegment
from kvstore.transport.base import GrantChecker, Transfer, Transport, TransportServer
from kvstore.types import Grant, GrantMode, SegmentInfo, Tier

CAPACITY = 32 << 20
SECRET = b"0123456789abcdef-test-secret"
S = TypeVar("S", bound=TransportServer)  # the server a Daemon runs


def later_ms(seconds: float = 60.0) -> int:
    return int((time.time() + seconds) * 1000)


def deadline(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


class BytesSegment(SegmentStorage):
    """A segment without view(), held in a bytearray: servers move its bytes through bounce
    buffers. Clearing `release` holds a read inside the server (`entered` is set once it is)."""

    def __init__(self, segment_id: str, capacity: int, tier: Tier = Tier.SSD) -> None:
        self.segment_id, self.capacity, self.tier = segment_id, capacity, tier
        self.data = bytearray(capacity)
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()

    def read_into(self, offset: int, dest: memoryview) -> None:
        self.entered.set()
        self.release.wait(10)
        dest[:] = self.data[offset : offset + len(dest)]

    def write_from(self, offset: int, src: memoryview) -> None:
        self.data[offset : offset + len(src)] = src

    def close(self, remove: bool = True) -> None:
        pass


class Daemon(Generic[S]):
    """A started `server_class` serving "seg-dram" (a DramSegment) and `plain` (by default a
    1 MiB BytesSegment "seg-plain"), with the signer that grants on them. `clock` is the
    daemon's clock; grants expire a minute after it by default."""

    def __init__(
        self,
        shm_dir: str,
        server_class: type[S],
        config: DaemonConfig | None = None,
        plain: SegmentStorage | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.signer = GrantSigner(SECRET)
        self.dram = DramSegment("seg-dram", CAPACITY, shm_dir)
        self.plain = plain or BytesSegment("seg-plain", 1 << 20)
        self.segments = {s.segment_id: s for s in (self.dram, self.plain)}
        self.clock = clock or SystemClock()
        self.checker = GrantChecker(self.signer, self.segments.get, self.clock)
        self._server_class = server_class
        self.server = self.start_server(config or DaemonConfig())

    def start_server(self, config: DaemonConfig) -> S:
        server = self._server_class(self.checker, config)
        server.start()
        for segment in self.segments.values():
            server.add_segment(segment)
        return server

    def restart(self, config: DaemonConfig | None = None) -> None:
        self.server.stop()
        self.server = self.start_server(config or DaemonConfig())

    def info(self, segment: SegmentStorage | None = None, capacity: int | None = None) -> SegmentInfo:
        """The descriptor the metadata service would hand out (`capacity` may lie about the size)."""
        segment = segment or self.dram
        endpoint = self.server.endpoint(segment)
        assert endpoint is not None, f"{type(self.server).__name__} offers no endpoint for {segment.segment_id}"
        return SegmentInfo(segment.segment_id, "d1", segment.tier, capacity or segment.capacity, (endpoint,))

    def grant(
        self, offset: int, length: int, mode: GrantMode, segment: str = "seg-dram", expires_ms: int | None = None
    ) -> Grant:
        return self.signer.sign(segment, offset, length, mode, expires_ms or now_ms(self.clock) + 60_000)

    def snapshot(self) -> bytes:
        """Every byte of the DRAM segment, to show that a refused request changed none."""
        return bytes(self.dram.view(0, CAPACITY))

    def close(self) -> None:
        self.server.stop()
        self.dram.close()


def put(daemon: Daemon[Any], client: Transport, offset: int, data: bytes) -> None:
    """Write `data` at `offset`; the checksums a transport computes while copying must be right,
    and so must the receipts a daemon gives (one per grant, which only the service can check)."""
    grant = daemon.grant(offset, len(data), GrantMode.WRITE)
    written = client.write(daemon.info(), [Transfer(grant, memoryview(data))], deadline())
    assert written.checksums in (None, [checksum(data)])
    assert written.receipts in (None, [daemon.signer.receipt(grant)])


def get(daemon: Daemon[Any], client: Transport, offset: int, length: int) -> bytes:
    out = bytearray(length)
    transfer = Transfer(daemon.grant(offset, length, GrantMode.READ), memoryview(out))
    assert client.read(daemon.info(), [transfer], deadline()) in (None, [checksum(out)])
    return bytes(out)


def round_trips_from_threads(
    daemon: Daemon[Any], client: Transport, rounds: int, size_step: int, threads: int = 8
) -> None:
    """`threads` threads share `client`, each putting and reading back blocks of growing size in
    its own 2 MiB of the segment; any thread's failure is raised here."""
    errors: list[BaseException] = []
    spacing = ((2 << 20) - 1000 - size_step * (rounds - 1)) // rounds  # the last block ends inside

    def worker(n: int) -> None:
        try:
            for i in range(rounds):
                data = os.urandom(1000 + size_step * i)
                offset = n * (2 << 20) + i * spacing
                put(daemon, client, offset, data)
                assert get(daemon, client, offset, len(data)) == data
        except BaseException as exc:  # noqa: BLE001 - reported by the calling thread
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
