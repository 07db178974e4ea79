"""Redis as a peer of `kvstore bench --compare redis`: a real redis-server (Debian's package,
installed by scripts/setup.sh) started by the bench on a free port of 127.0.0.1, in memory only
(no RDB, no AOF), measured through redis-py by the same loops as kvstore.

The calls: SET / GET (get_into copies the reply into the caller's buffer: Redis has no zero-copy
read), MSET / MGET for batches, EXISTS, DEL. Besides the loops kvstore runs, "get-tiny" times a
GET of an 8-byte value: the floor of one Redis round trip. Server CPU is redis-server's.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvstore.bench import latency, store
from kvstore.bench.cpu import CpuMeter
from kvstore.bench.fmt import fmt_size
from kvstore.bench.plugin import PeerOutcome, PeerSpec, Progress
from kvstore.bench.results import Latency, Spread

PATH = "redis"
TINY = b"tinyval!"  # 8 bytes
_PIPELINE = 1024  # EXISTS per pipeline in match_prefix


class RedisTarget:
    """The KVTarget calls on a redis-py client."""

    def __init__(self, client: Any) -> None:
        self._r = client

    def prepare(self, arrays: Sequence[np.ndarray]) -> None:
        pass

    def put(self, key: str, value: Any) -> bool:
        return bool(self._r.set(key, memoryview(value)))

    def put_many(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        self._r.mset({k: memoryview(v) for k, v in zip(keys, values)})
        return [True] * len(keys)

    def get_into(self, key: str, buffer: Any) -> int:
        data = self._r.get(key)
        if data is None:
            raise KeyError(key)
        np.copyto(buffer[: len(data)], np.frombuffer(data, dtype=np.uint8))
        return len(data)

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[Any]:
        out: list[Any] = []
        for data, buffer in zip(self._r.mget(keys), buffers):
            if data is None:
                out.append(None)
                continue
            np.copyto(buffer[: len(data)], np.frombuffer(data, dtype=np.uint8))
            out.append(len(data))
        return out

    def exists(self, key: str) -> bool:
        return bool(self._r.exists(key))

    def match_prefix(self, keys: Sequence[str]) -> int:
        for start in range(0, len(keys), _PIPELINE):
            pipe = self._r.pipeline(transaction=False)
            for key in keys[start : start + _PIPELINE]:
                pipe.exists(key)
            for i, found in enumerate(pipe.execute()):
                if not found:
                    return start + i
        return len(keys)

    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Any]:
        if keys:
            self._r.delete(*keys)
        return [None] * len(keys)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """redis-server on a free port of 127.0.0.1, ready once it answers PING."""

    def __init__(self, start_timeout_s: float = 20.0, persist: bool = False) -> None:
        """`persist`: with its AOF fsynced every second (what a metadata service on Redis needs)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run scripts/setup.sh (Debian's redis-server)")
        self.port = _free_port()
        self._dir = tempfile.mkdtemp(prefix="kvstore-bench-redis-")
        aof = ["--appendonly", "yes", "--appendfsync", "everysec"] if persist else ["--appendonly", "no"]
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *aof]
        argv += ["--dir", self._dir, "--protected-mode", "no"]
        self.popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + start_timeout_s
        while not self._pong():
            if self.popen.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.05)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)


def version() -> str:
    try:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "?")


def describe(spec: PeerSpec) -> str:
    import redis

    return (
        f"redis-server {version()} (no persistence) on 127.0.0.1, redis-py {redis.__version__} in the bench process; "
        "get_into = GET + a copy into the buffer, batches = MSET / MGET; server CPU = redis-server"
    )


def _tiny_get(target: RedisTarget, client: Any, spec: PeerSpec) -> Latency:
    client.set("tiny", TINY)
    p50, p99 = [], []
    for _ in range(spec.latency.repeats):
        took = latency.samples([lambda: client.get("tiny")] * spec.latency.ops) * 1e6
        p50.append(float(np.percentile(took, 50)))
        p99.append(float(np.percentile(took, 99)))
    return Latency(PATH, "get-tiny", len(TINY), spec.latency.ops, Spread.of(p50), Spread.of(p99))


def measure(spec: PeerSpec, progress: Progress) -> PeerOutcome:
    import redis

    outcome = PeerOutcome()
    started = time.perf_counter()
    try:
        server = RedisServer()
    except RuntimeError as exc:
        outcome.unavailable = str(exc)
        return outcome
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        target = RedisTarget(client)
        pool = store.SourcePool(spec.pool_bytes)
        res = outcome.results
        for size in spec.sizes:
            progress(f"{PATH} throughput {fmt_size(size)}")
            prefix = f"{spec.key_prefix}/tput/{size}"
            res.throughput += store.measure_single(target, target, PATH, size, spec.plan, f"{prefix}/s", pool)
            res.throughput += store.measure_batches(target, target, PATH, size, spec.plan, f"{prefix}/b", pool)
        progress(f"{PATH} latency")
        cpu = CpuMeter([server.popen.pid], "redis-server") if CpuMeter.available() else None
        lat, cpus = latency.measure_latency(
            target, target, PATH, spec.latency, f"{spec.key_prefix}/lat", pool, cpu, cpu.what if cpu else ""
        )
        res.latency += [*lat, _tiny_get(target, client, spec)]
        res.server_cpu += cpus
        client.close()
    except (redis.RedisError, OSError) as exc:
        outcome.unavailable = f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()
        outcome.seconds = time.perf_counter() - started
    return outcome
