"""The Mooncake Store processes of `kvstore bench --compare mooncake` (started by
benchmarks.peers.mooncake).

    python -m benchmarks.peers.mooncake_proc server --master HOST:PORT --segment BYTES
    python -m benchmarks.peers.mooncake_proc client --master HOST:PORT --spec JSON --limits JSON
    python -m benchmarks.peers.mooncake_proc exec PROGRAM [ARGS...]

`server` sets up a MooncakeDistributedStore that contributes a global segment, says ready, and
closes when its stdin does. `client` contributes no memory and measures through `MooncakeTarget`
with kvstore's own bench code (kvstore.bench.store and .latency), so both stores are timed by the
same loops on the same keys, sizes and batches, and counts the CPU the master and the server
spend meanwhile. `exec` runs PROGRAM (mooncake_master) bound to the bench's lifetime.

Messages go out as JSON lines on the original stdout; fd 1 itself is pointed at stderr, so
nothing Mooncake prints can corrupt them. Every Mooncake call runs under `Watchdog`: one that
has not returned by its deadline (a hung peer, a master that went away mid-setup) reports
"unavailable" and ends the process — a call cannot be cancelled, but the bindings release the
GIL, so the watchdog thread runs while one is stuck.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from kvstore.bench.plugin import PeerSpec

KiB, MiB = 1 << 10, 1 << 20
PREFAULT_BLOCK = 16 * MiB
PREFAULT_FILL = 0.85  # of the segment: below the master's 90 % eviction watermark
PROBE_KEY = "kvstore-bench-probe"
SERVER_LOCAL_BUFFER = 16 * MiB  # setup()'s local buffer: staging for the bytes API, unused here
CLIENT_LOCAL_BUFFER = 64 * MiB

# Mooncake's ErrorCode values (mooncake-store/include/types.h) seen from the Python API.
_CODES = {
    -600: "INVALID_PARAMS",
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
}


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM this process when the bench dies (Linux; kept across exec), so a
    SIGKILLed bench leaves no master or server behind."""
    parent = os.environ.get("KVSTORE_BENCH_PARENT_PID")
    if not parent:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # it died before the request took effect
        os._exit(1)


class Channel:
    """JSON lines to the driver on the original stdout, from any thread."""

    def __init__(self) -> None:
        fd = os.dup(1)
        os.dup2(2, 1)  # C++ prints to fd 1 end up in the log, not in the protocol
        sys.stdout = sys.stderr
        self._out = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def send(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self._out.write(json.dumps({"kind": kind, **fields}) + "\n")
            self._out.flush()


class Watchdog:
    """Ends the process when a Mooncake call outlives its deadline. Arming costs two attribute
    writes, so timed calls carry it too."""

    def __init__(self, channel: Channel, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._channel = channel
        self._deadline = 0.0
        self._limit = 0.0
        self._what = ""
        threading.Thread(target=self._watch, name="mooncake-watchdog", daemon=True).start()

    def call(self, what: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        self._what, self._limit = what, timeout_s or self.timeout_s
        self._deadline = time.monotonic() + self._limit
        try:
            return fn(*args)
        finally:
            self._deadline = 0.0

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            deadline = self._deadline
            if deadline and time.monotonic() > deadline:
                try:
                    self._channel.send("unavailable", reason=f"{self._what} did not return within {self._limit:.0f} s")
                finally:
                    os._exit(3)


class MooncakeCallError(Exception):
    def __init__(self, what: str, rc: int) -> None:
        super().__init__(f"{what} returned {rc} ({_CODES.get(rc, 'error')})")
        self.rc = rc


def _address(buffer: Any) -> int:
    import numpy as np

    if isinstance(buffer, np.ndarray):
        return buffer.ctypes.data
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


class MooncakeTarget:
    """The KVTarget calls (kvstore.bench.store) on a MooncakeDistributedStore: put_from / get_into
    and their batch_ forms on numpy buffers, is_exist, batch_is_exist as a prefix match (the
    leading run of 1s), batch_remove. A negative return code raises MooncakeCallError.

    The memory a measurement uses (its source pool and destination buffers) is registered with
    the store by `prepare`, untimed (the documented zero-copy use, and 1.5-2x faster for 16 MiB
    gets here than unregistered); a buffer seen later that lies in none is registered on first
    use. All are held until `release_buffers`, so an address is never reused while registered."""

    def __init__(self, store: Any, watchdog: Watchdog) -> None:
        self._store = store
        self._call = watchdog.call
        self._registered: dict[int, tuple[int, Any]] = {}  # base address -> (end, the array)

    def _register(self, buffer: Any) -> None:
        ptr = _address(buffer)
        rc = self._call("register_buffer", self._store.register_buffer, ptr, buffer.nbytes)
        if rc != 0:
            raise MooncakeCallError("register_buffer", rc)
        self._registered[ptr] = (ptr + buffer.nbytes, buffer)

    def _ptr(self, buffer: Any) -> int:
        ptr = _address(buffer)
        if not any(base <= ptr and ptr + buffer.nbytes <= end for base, (end, _) in self._registered.items()):
            self._register(buffer)
        return ptr

    def prepare(self, arrays: Sequence[np.ndarray]) -> None:
        for array in arrays:
            self._ptr(array)

    def release_buffers(self) -> None:
        for ptr in self._registered:
            self._call("unregister_buffer", self._store.unregister_buffer, ptr)
        self._registered.clear()

    def put(self, key: str, value: Any) -> bool:
        rc = self._call("put_from", self._store.put_from, key, self._ptr(value), value.nbytes)
        if rc != 0:
            raise MooncakeCallError(f"put_from({key!r})", rc)
        return True

    def put_many(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        rcs = self._call(
            "batch_put_from",
            self._store.batch_put_from,
            list(keys),
            [self._ptr(v) for v in values],
            [v.nbytes for v in values],
        )
        bad = next((rc for rc in rcs if rc != 0), None)
        if bad is not None:
            raise MooncakeCallError(f"batch_put_from of {len(keys)} keys", bad)
        return [True] * len(rcs)

    def get_into(self, key: str, buffer: Any) -> int:
        n: int = self._call("get_into", self._store.get_into, key, self._ptr(buffer), buffer.nbytes)
        if n < 0:
            raise MooncakeCallError(f"get_into({key!r})", n)
        return n

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[Any]:
        ns: list[Any] = self._call(
            "batch_get_into",
            self._store.batch_get_into,
            list(keys),
            [self._ptr(b) for b in buffers],
            [b.nbytes for b in buffers],
        )
        bad = next((n for n in ns if n < 0), None)
        if bad is not None:
            raise MooncakeCallError(f"batch_get_into of {len(keys)} keys", bad)
        return ns

    def exists(self, key: str) -> bool:
        rc: int = self._call("is_exist", self._store.is_exist, key)
        if rc < 0:
            raise MooncakeCallError(f"is_exist({key!r})", rc)
        return rc == 1

    def match_prefix(self, keys: Sequence[str]) -> int:
        rcs = self._call("batch_is_exist", self._store.batch_is_exist, list(keys))
        if rcs.count(1) == len(rcs):
            return len(rcs)
        for i, rc in enumerate(rcs):
            if rc < 0:
                raise MooncakeCallError(f"batch_is_exist of {len(keys)} keys", rc)
            if rc != 1:
                return i
        return len(rcs)

    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Any]:
        removed: list[Any] = self._call("batch_remove", self._store.batch_remove, list(keys), force)
        return removed

    def alive(self) -> str | None:
        """None if the master still answers; else why not."""
        rc = self._call("is_exist", self._store.is_exist, PROBE_KEY)
        return None if rc >= 0 else f"the master no longer answers (is_exist returned {rc})"


def _setup(watchdog: Watchdog, master: str, segment: int, local_buffer: int, timeout_s: float) -> Any:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise MooncakeCallError(f"import mooncake.store ({exc})", -1) from exc
    store = MooncakeDistributedStore()
    rc = watchdog.call(
        "setup", store.setup, "127.0.0.1", "P2PHANDSHAKE", segment, local_buffer, "tcp", "", master, timeout_s=timeout_s
    )
    if rc != 0:
        raise MooncakeCallError(f"setup(master {master})", rc)
    return store


def run_server(channel: Channel, master: str, segment: int, setup_timeout_s: float) -> int:
    watchdog = Watchdog(channel, 10.0)
    t0 = time.perf_counter()
    try:
        store = _setup(watchdog, master, segment, SERVER_LOCAL_BUFFER, setup_timeout_s)
    except MooncakeCallError as exc:
        channel.send("unavailable", reason=str(exc))
        return 1
    channel.send("ready", setup_s=time.perf_counter() - t0, hostname=store.get_hostname())
    sys.stdin.read()  # until the driver closes it
    watchdog.call("close", store.close)
    return 0


def _prefault(target: MooncakeTarget, spec: PeerSpec, channel: Channel) -> list[Any]:
    """Write 85 % of the server's segment once, then remove it: the segment is fresh anonymous
    memory, and whichever phase first touched a page would pay its fault (kvstore's daemon
    preallocates its segment files at start for the same reason)."""
    import numpy as np

    block = np.ones(PREFAULT_BLOCK, dtype=np.uint8)
    keys = [f"{spec.key_prefix}/prefault/{i}" for i in range(int(PREFAULT_FILL * spec.segment_size) // PREFAULT_BLOCK)]
    t0 = time.perf_counter()
    try:
        for key in keys:
            target.put(key, block)
    finally:
        target.remove_many(keys, force=True)
    channel.send("note", text=f"prefaulted {len(keys)} x 16 MiB of the segment in {time.perf_counter() - t0:.1f} s")
    return []


def _result(channel: Channel, result: Any) -> None:
    from kvstore.bench.results import message

    channel.send("result", **message(result))


def run_client(channel: Channel, master: str, spec_json: str, limits_json: str) -> int:
    from benchmarks.peers.mooncake import PATH, MooncakeLimits
    from kvstore.bench import latency, store
    from kvstore.bench.cpu import CpuMeter
    from kvstore.bench.fmt import fmt_size
    from kvstore.bench.plugin import PeerSpec

    spec = PeerSpec.from_json(spec_json)
    limits = MooncakeLimits.from_json(limits_json)
    watchdog = Watchdog(channel, limits.call_timeout_s)
    t0 = time.perf_counter()
    try:
        mc = _setup(watchdog, master, 0, CLIENT_LOCAL_BUFFER, limits.setup_timeout_s)
    except MooncakeCallError as exc:
        channel.send("unavailable", reason=str(exc))
        return 1
    channel.send("ready", setup_s=time.perf_counter() - t0)
    target = MooncakeTarget(mc, watchdog)
    plan = spec.plan
    pool = store.SourcePool(spec.pool_bytes)
    cpu = CpuMeter(limits.server_pids, "master + server") if limits.server_pids and CpuMeter.available() else None

    def throughput(size: int) -> list[Any]:
        # the same calls as kvstore.bench.sections' throughput section (one client writes and reads)
        prefix = f"{spec.key_prefix}/tput/{size}"
        out: list[Any] = store.measure_single(target, target, PATH, size, plan, f"{prefix}/s", pool)
        return out + store.measure_batches(target, target, PATH, size, plan, f"{prefix}/b", pool)

    def latencies() -> list[Any]:
        lat, cpus = latency.measure_latency(
            target, target, PATH, spec.latency, f"{spec.key_prefix}/lat", pool, cpu, cpu.what if cpu else ""
        )
        return [*lat, *cpus]

    def prefix_rate() -> list[Any]:
        try:
            rate = latency.measure_prefix(
                target, spec.prefix_batch, spec.prefix_calls, f"{spec.key_prefix}/prefix", plan.repeats
            )
        except MooncakeCallError as exc:
            channel.send(
                "skipped",
                what=f"batch_is_exist on {spec.prefix_batch}-key batches",
                reason=f"{exc}; measured on {limits.prefix_fallback_batch}-key batches instead",
            )
            rate = latency.measure_prefix(
                target,
                limits.prefix_fallback_batch,
                spec.prefix_calls,
                f"{spec.key_prefix}/prefix-fallback",
                plan.repeats,
            )
        return [replace(rate, path=PATH)]

    steps: list[tuple[str, Callable[[], list[Any]]]] = []
    if limits.prefault:
        steps.append(("prefault", lambda: _prefault(target, spec, channel)))
    steps += [(f"throughput {fmt_size(size)}", partial(throughput, size)) for size in spec.sizes]
    steps.append(("latency", latencies))
    steps.append((f"batch_is_exist on {spec.prefix_batch}-key batches", prefix_rate))
    for what, step in steps:
        channel.send("progress", what=what)
        try:
            for result in step():
                _result(channel, result)
        except (MooncakeCallError, AssertionError) as exc:
            channel.send("skipped", what=what, reason=str(exc))
            reason = target.alive()
            if reason is not None:
                channel.send("unavailable", reason=reason)
                return 1
        finally:
            target.release_buffers()
    channel.send("done")
    watchdog.call("close", mc.close, timeout_s=10.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    if argv[:1] == ["exec"] and len(argv) > 1:
        os.execv(argv[1], argv[1:])
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers.mooncake_proc")
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--master", required=True)
    ap.add_argument("--segment", type=int, default=0)
    ap.add_argument("--setup-timeout", type=float, default=20.0)
    ap.add_argument("--spec", default="")
    ap.add_argument("--limits", default="{}")
    args = ap.parse_args(argv)
    channel = Channel()
    if args.role == "server":
        return run_server(channel, args.master, args.segment, args.setup_timeout)
    return run_client(channel, args.master, args.spec, args.limits)


if __name__ == "__main__":
    sys.exit(main())
