"""The ucx transport against a real UcxServer: in this process for behaviour and refused grants,
in a child process for a daemon that is killed or hung mid-call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("ucxx", reason="the ucx transport needs the ucx extra: pip install 'kvcachestore[ucx]'")

from kvstore.checksum import checksum
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, PermissionDenied, TransportError
from kvstore.grant import GrantSigner
from kvstore.hostid import host_id
from kvstore.observe import NoTransfers
from kvstore.transport import ucx_wire as ucx
from kvstore.transport.base import Transfer
from kvstore.transport.ucx_client import UcxTransport
from kvstore.transport.ucx_server import UcxServer
from kvstore.types import Endpoint, Grant, GrantMode, SegmentInfo, Tier
from tests.cluster import wait_until
from tests.transport_harness import (
    CAPACITY,
    SECRET,
    BytesSegment,
    Daemon,
    deadline,
    get,
    later_ms,
    put,
    round_trips_from_threads,
)


@pytest.fixture
def daemon(tmp_path) -> Iterator[Daemon[UcxServer]]:
    d = Daemon(str(tmp_path), UcxServer)
    yield d
    d.close()


@pytest.fixture
def client() -> Iterator[UcxTransport]:
    c = UcxTransport()
    yield c
    c.close()


# --- behaviour -----------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 100, 8193, 65537, 1 << 20, (8 << 20) + 3])
def test_round_trip_is_byte_identical(daemon: Daemon[UcxServer], client: UcxTransport, size: int) -> None:
    data = os.urandom(size)
    put(daemon, client, 12345, data)
    assert bytes(daemon.dram.view(12345, size)) == data
    assert get(daemon, client, 12345, size) == data


@pytest.mark.parametrize("count", [1000, 2500])  # 2500: more than one request's MAX_ITEMS
def test_batch_of_small_blocks(daemon: Daemon[UcxServer], client: UcxTransport, count: int) -> None:
    blocks = [os.urandom(1 + i % 300) for i in range(count)]
    info = daemon.info(daemon.dram)
    client.write(
        info,
        [Transfer(daemon.grant(i * 512, len(b), GrantMode.WRITE), memoryview(b)) for i, b in enumerate(blocks)],
        deadline(),
    )
    outs = [bytearray(len(b)) for b in blocks]
    digests = client.read(
        info,
        [
            Transfer(daemon.grant(i * 512, len(b), GrantMode.READ), memoryview(out))
            for i, (b, out) in enumerate(zip(blocks, outs))
        ],
        deadline(),
    )
    assert [bytes(o) for o in outs] == blocks
    assert digests == [checksum(b) for b in blocks]
    assert client.connections == 1 and daemon.server.connections == 1


def test_eight_threads_share_one_transport(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    round_trips_from_threads(daemon, client, rounds=20, size_step=9973)


def test_segment_without_view_uses_bounce_buffers(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    assert isinstance(daemon.plain, BytesSegment)  # the harness's default segment without view()
    info, data = daemon.info(daemon.plain), os.urandom(300_000)
    client.write(
        info, [Transfer(daemon.grant(7, len(data), GrantMode.WRITE, "seg-plain"), memoryview(data))], deadline()
    )
    assert bytes(daemon.plain.data[7 : 7 + len(data)]) == data
    out = bytearray(len(data))
    client.read(info, [Transfer(daemon.grant(7, len(data), GrantMode.READ, "seg-plain"), memoryview(out))], deadline())
    assert out == data


def test_reads_into_typed_buffers(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    data = os.urandom(4096)
    put(daemon, client, 0, data)
    out = memoryview(bytearray(4096)).cast("I")
    client.read(daemon.info(daemon.dram), [Transfer(daemon.grant(0, 4096, GrantMode.READ), out)], deadline())
    assert out.tobytes() == data


def test_close_says_goodbye(daemon: Daemon[UcxServer]) -> None:
    c = UcxTransport()
    put(daemon, c, 0, b"x")
    assert daemon.server.connections == 1
    c.close()
    wait_until(lambda: daemon.server.connections == 0, timeout=5, what="the daemon to drop the client")
    with pytest.raises(TransportError, match="closed"):
        put(daemon, c, 0, b"x")


# --- refused grants ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [GrantMode.READ, GrantMode.WRITE])
@pytest.mark.parametrize("bad", ["forged", "expired", "out_of_range", "unknown_segment", "wrong_mode"])
def test_bad_grants_are_refused_and_nothing_moves(
    daemon: Daemon[UcxServer], client: UcxTransport, mode: GrantMode, bad: str
) -> None:
    seeded = os.urandom(8192)
    put(daemon, client, 0, seeded)
    info, good = daemon.info(daemon.dram), daemon.grant(0, 4096, mode)
    if bad == "forged":
        grant = Grant(good.segment_id, good.offset, good.length, mode, good.expires_ms, bytes(16))
    elif bad == "expired":
        grant = daemon.grant(0, 4096, mode, expires_ms=later_ms(-1))
    elif bad == "out_of_range":
        grant = daemon.grant(CAPACITY - 100, 4096, mode)
    elif bad == "wrong_mode":  # a grant for the other direction, relabelled
        other = daemon.grant(0, 4096, GrantMode.READ if mode is GrantMode.WRITE else GrantMode.WRITE)
        grant = Grant(other.segment_id, other.offset, other.length, mode, other.expires_ms, other.mac)
    else:
        grant = daemon.grant(0, 4096, mode, segment="nope")
        info = SegmentInfo("nope", "d1", Tier.DRAM, CAPACITY, info.endpoints)
    # A valid item first: nothing moves unless every grant of the request checks.
    out = bytearray(4096)
    transfers = [Transfer(grant, memoryview(bytearray(b"\xee" * 4096)))]
    if bad != "unknown_segment":
        transfers.insert(0, Transfer(good, memoryview(out if mode is GrantMode.READ else bytes(4096))))
    with pytest.raises(PermissionDenied):
        (client.write if mode is GrantMode.WRITE else client.read)(info, transfers, deadline())
    assert bytes(daemon.dram.view(0, 8192)) == seeded and not any(out)
    assert get(daemon, client, 0, 8192) == seeded  # the same connection still serves
    assert client.connections == 1


def test_refused_large_write_sends_no_payload(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    grant = daemon.grant(0, 16 << 20, GrantMode.WRITE, expires_ms=later_ms(-1))
    started = time.monotonic()
    with pytest.raises(PermissionDenied, match="expired"):
        client.write(daemon.info(daemon.dram), [Transfer(grant, memoryview(bytearray(16 << 20)))], deadline())
    assert time.monotonic() - started < 1.0
    assert get(daemon, client, 0, 10) == bytes(10)


def test_client_checks_buffers_against_grants(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    info, read_grant = daemon.info(daemon.dram), daemon.grant(0, 10, GrantMode.READ)
    for transfer in (
        Transfer(read_grant, memoryview(bytearray(9))),  # wrong size
        Transfer(daemon.grant(0, 10, GrantMode.WRITE), memoryview(bytearray(10))),
        Transfer(read_grant, memoryview(bytes(10))),  # read-only
        Transfer(read_grant, memoryview(bytearray(20))[::2]),  # strided
    ):
        with pytest.raises(InvalidArgument):
            client.read(info, [transfer], deadline())


class RawPeer:
    """A ucx client driven by hand (the controllable peer): it says HELLO as UcxTransport does,
    then sends whatever request a test builds and returns the status the daemon answers."""

    def __init__(self, address: str) -> None:
        worker_address, _, _ = ucx.parse_address(address)
        self.worker = ucx.Worker(ClientConfig().ucx_tls)
        self.peer = ucx.Peer(self.worker.connect(worker_address), os.getpid(), True)
        me = host_id().encode()
        hello = (
            ucx.HEADER.pack(ucx.MAGIC, ucx.VERSION, ucx.OP_HELLO, 0, 0, 0, 0)
            + ucx.HELLO.pack(os.getpid(), len(me), len(self.worker.address))
            + me
            + self.worker.address
        )
        self.peer.conn_id = self.ask(hello, seq=0)

    def ask(self, request: bytes, seq: int) -> int:
        status = bytearray(ucx.STATUS_BYTES)
        answered = self.worker.recv(self.peer.ep, status, ucx.tag(self.peer.conn_id, seq, ucx.KIND_STATUS))
        sent = self.worker.send(self.peer.ep, bytearray(request), ucx.tag(self.peer.conn_id, seq, ucx.KIND_CTRL))
        give_up = deadline()
        while not (answered[0].completed and sent[0].completed):
            assert time.monotonic() < give_up, "the daemon did not answer"
            self.worker.progress(50)
        return ucx.check_status(status)

    def close(self) -> None:
        self.worker.close(self.peer)
        self.worker.settle(1.0)


def test_malformed_request_gets_an_error_status(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    put(daemon, client, 0, b"abc")
    peer = RawPeer(daemon.info(daemon.dram).endpoints[0].address)
    try:
        assert peer.peer.conn_id > 0 and daemon.server.connections == 2
        bogus = ucx.HEADER.pack(ucx.MAGIC, ucx.VERSION, 9, 4, 1, peer.peer.conn_id, 1) + b"nope"  # op 9
        with pytest.raises(InvalidArgument, match="malformed"):
            peer.ask(bogus, seq=1)
    finally:
        peer.close()
    assert get(daemon, client, 0, 3) == b"abc"  # and the daemon serves on


# --- a daemon that stops, dies or hangs ----------------------------------------------------------


def test_stopped_daemon_fails_at_the_deadline(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    put(daemon, client, 0, b"abc")
    daemon.server.stop()  # same process: only the deadline can tell
    started = time.monotonic()
    with pytest.raises(TransportError, match="deadline"):
        client.read(
            daemon.info(daemon.dram),
            [Transfer(daemon.grant(0, 3, GrantMode.READ), memoryview(bytearray(3)))],
            time.monotonic() + 0.5,
        )
    assert time.monotonic() - started < 1.5
    assert client.connections == 0  # dropped: the next call connects afresh


def test_restarted_daemon_is_reached_with_the_same_client(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    put(daemon, client, 0, b"before")
    daemon.restart()
    assert get(daemon, client, 0, 6) == b"before"


CHILD = textwrap.dedent("""
    import os, signal, sys
    from kvstore.config import DaemonConfig
    from kvstore.grant import GrantSigner
    from kvstore.storage.dram import DramSegment
    from kvstore.transport.base import GrantChecker
    from kvstore.transport.ucx_server import UcxServer

    class Server(UcxServer):
        hang = "--hang" in sys.argv

        def _advance(self):
            super()._advance()
            # --hang: stop this process, once, when a large read is under way (its first piece sent)
            if self.hang and any(len(b.to_send) > 8 for b in self._batches):
                self.hang = False
                os.kill(os.getpid(), signal.SIGSTOP)

    seg = DramSegment("seg-dram", {capacity}, sys.argv[1])
    seg.view(0, {capacity})[:] = bytes(range(256)) * ({capacity} // 256)
    server = Server(GrantChecker(GrantSigner({secret!r}), {{"seg-dram": seg}}.get), DaemonConfig())
    server.start()
    print(server.endpoint(seg).address, flush=True)
    sys.stdin.read()
""").format(capacity=CAPACITY, secret=SECRET)


def start_child(shm_dir: str, *flags: str) -> tuple[subprocess.Popen[str], SegmentInfo]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, shm_dir, *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None  # stdout=PIPE
    address = proc.stdout.readline().strip()
    assert address, "the child daemon did not start"
    return proc, SegmentInfo("seg-dram", "d1", Tier.DRAM, CAPACITY, (Endpoint("ucx", address),))


@pytest.fixture
def children(tmp_path) -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)


def read_from(info: SegmentInfo, client: UcxTransport, out: memoryview, seconds: float) -> None:
    grant = GrantSigner(SECRET).sign("seg-dram", 0, len(out), GrantMode.READ, later_ms())
    client.read(info, [Transfer(grant, out)], time.monotonic() + seconds)


def test_killed_daemon_fails_fast_not_at_the_deadline(tmp_path, children, client: UcxTransport) -> None:
    proc, info = start_child(str(tmp_path))
    children.append(proc)
    out = memoryview(bytearray(4096))
    read_from(info, client, out, 10)
    assert bytes(out[:4]) == bytes(range(4))
    proc.kill()
    proc.wait(10)
    started = time.monotonic()
    with pytest.raises(TransportError, match="gone"):
        read_from(info, client, out, 10)
    assert time.monotonic() - started < 1.0
    assert not client.can_reach(info)


def test_hung_daemon_fails_at_the_deadline_and_writes_nothing_late(tmp_path, children, client: UcxTransport) -> None:
    proc, info = start_child(str(tmp_path), "--hang")
    children.append(proc)
    out = memoryview(bytearray(CAPACITY))
    started = time.monotonic()
    with pytest.raises(TransportError, match="deadline"):
        read_from(info, client, out, 1.0)  # the daemon stops itself mid-payload
    assert time.monotonic() - started < 2.0
    snapshot = out.tobytes()
    stranded = client.stranded_pending()
    assert stranded > 0  # receives were under way when the call gave up
    (tmp_path / "b").mkdir()
    other, other_info = start_child(str(tmp_path / "b"))
    children.append(other)
    os.kill(proc.pid, signal.SIGCONT)  # it resumes and sends the rest ...

    def late_pieces_landed() -> bool:  # ... while this worker progresses
        read_from(other_info, client, memoryview(bytearray(16)), 10)
        return client.stranded_pending() < stranded

    wait_until(late_pieces_landed, timeout=20, what="the resumed daemon's late pieces to land in abandoned staging")
    assert out.tobytes() == snapshot  # they landed there, not in the caller's buffer


KILLED_CLIENT = textwrap.dedent("""
    import sys, time
    from kvstore.grant import GrantSigner
    from kvstore.transport.base import Transfer
    from kvstore.transport.ucx_client import UcxTransport
    from kvstore.types import Endpoint, GrantMode, SegmentInfo, Tier
    info = SegmentInfo("seg-dram", "d1", Tier.DRAM, {capacity}, (Endpoint("ucx", sys.argv[1]),))
    data = memoryview(bytearray(16 << 20))
    client, signer = UcxTransport(), GrantSigner({secret!r})
    print("writing", flush=True)
    while True:
        grant = signer.sign("seg-dram", 0, len(data), GrantMode.WRITE, int(time.time() * 1000) + 60000)
        client.write(info, [Transfer(grant, data)], time.monotonic() + 10)
""").format(capacity=CAPACITY, secret=SECRET)


class WritesStarted(NoTransfers):
    """The daemon's transfer observer (ucx reports a request as it starts): `second` is set once
    a second write started, so a writer killed after it dies with a write under way (it writes
    without pause)."""

    def __init__(self) -> None:
        self.count, self.second = 0, threading.Event()

    def transferred(self, transport: str, mode: GrantMode, nbytes: int, seconds: float | None) -> None:
        if mode is GrantMode.WRITE:
            self.count += 1
            if self.count >= 2:
                self.second.set()


def test_client_killed_mid_write_leaves_the_daemon_serving(daemon: Daemon[UcxServer], client: UcxTransport) -> None:
    address = daemon.info(daemon.dram).endpoints[0].address
    daemon.server.observer = started = WritesStarted()
    writer = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, address], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        assert started.second.wait(20), "the writer's writes did not reach the daemon"
    finally:
        writer.kill()
        writer.wait(10)
    wait_until(lambda: daemon.server.connections == 0, timeout=5, what="the daemon to drop the dead client")
    put(daemon, client, 0, b"still here")
    assert get(daemon, client, 0, 10) == b"still here"
