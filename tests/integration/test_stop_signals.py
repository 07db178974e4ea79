"""A SIGTERM stops every kvstore server process cleanly, whichever of its threads the kernel hands
it to. A process-directed signal may land on any thread; here each one is sent to a thread other
than the main one (tgkill), the case in which a main thread parked in a lock never woke."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess

import pytest

from tests.cluster import Cluster, Proc, wait_until

_libc = ctypes.CDLL(None, use_errno=True)


def _threads(pid: int) -> list[int]:
    return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))


def _term_a_side_thread(pid: int) -> None:
    side = [tid for tid in _threads(pid) if tid != pid]
    assert side, f"process {pid} runs no thread besides its main one"
    if _libc.tgkill(pid, side[-1], signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")


def _stops_cleanly(proc: Proc) -> int:
    _term_a_side_thread(proc.pid)
    try:
        return proc.popen.wait(timeout=30)  # a bound on a hang, not a measure of speed
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{proc.args[3:]} ignored a SIGTERM taken by a side thread:\n{''.join(proc.lines)}")


def test_serve_stops_on_a_sigterm_taken_by_any_thread(cluster: Cluster):
    proc, _ = cluster.serve("64MiB")
    assert _stops_cleanly(proc) == 0
    wait_until(lambda: any("kvstore stopped" in line for line in proc.lines), 10, "the stop line")


def test_meta_and_daemon_stop_on_a_sigterm_taken_by_any_thread(cluster: Cluster):
    meta, address = cluster.meta()
    daemon = cluster.daemon(address, "64MiB")
    assert _stops_cleanly(daemon) == 0
    assert _stops_cleanly(meta) == 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _live(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_shard_process_stops_on_its_own_sigterm_and_serve_stops_the_rest(cluster: Cluster):
    proc, _ = cluster.serve("64MiB", "--shards", "3")
    shards = [pid for pid in _children(proc.pid) if re.search(rb"multiprocessing", _cmdline(pid))]
    shards = [pid for pid in shards if len(_threads(pid)) > 1]
    assert len(shards) >= 2, f"expected two shard processes under {proc.pid}, found {shards}"
    _term_a_side_thread(shards[0])
    wait_until(lambda: not _live(shards[0]), 30, "the terminated shard to exit")
    assert _stops_cleanly(proc) == 0
    wait_until(lambda: not any(_live(pid) for pid in shards), 30, "every shard to exit with serve")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def test_the_engine_and_router_servers_stop_on_a_sigterm_taken_by_any_thread():
    from kvstore.engines.launch import Fleet

    with Fleet() as fleet:
        engine, url = fleet.engine("colocated")
        router, _ = fleet.router([], [], [url])
        for proc in (router, engine):
            _term_a_side_thread(proc.pid)
            try:
                proc.popen.wait(timeout=30)  # a bound on a hang, not a measure of speed
            except subprocess.TimeoutExpired:
                proc.kill()
                pytest.fail(f"{proc.name} ignored a SIGTERM taken by a side thread:\n{''.join(proc.lines)}")
