"""Mooncake Store as a peer of `kvstore bench --compare mooncake`, measured in the same run.

It runs as three processes, like kvstore's meta + daemon + measuring client:

    mooncake_master                  bound to 127.0.0.1 (RPC and metrics), on free ports
    mooncake_proc server             contributes the global segment every put lands in (sized
                                     like kvstore's daemon DRAM), then waits
    mooncake_proc client             contributes no memory; measures with kvstore's own bench
                                     code through an adapter, and reports JSON lines back here

all from the pip package `mooncake-transfer-engine-non-cuda`, protocol tcp, P2P handshake. Its
Transfer Engine ports bind every interface whatever it is told (see notes/issue3.md); everything
this module connects to is 127.0.0.1. The client counts the CPU the master and the server spend
per call (kvstore.bench.cpu), as kvstore's sections count the metadata service's and daemon's.

Nothing here imports mooncake: the children do. A failure of any kind (not installed, a master
that will not start, a setup that fails, a call that outlives its deadline, a child that dies)
ends as `PeerOutcome.unavailable` with the reason, never as an exception; the processes are
always stopped, also on Ctrl-C (children run in their own session, so the signal reaches only
the bench, which then stops them), and die with the bench if it is killed (see mooncake_proc).
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvstore.bench.fmt import fmt_size
from kvstore.bench.plugin import PeerOutcome, PeerSpec, Progress
from kvstore.bench.results import Skipped, from_message

PATH = "mooncake-store"  # the label of its results
PARENT_ENV = "KVSTORE_BENCH_PARENT_PID"  # children die with this process (mooncake_proc)
CHILD_MODULE = "benchmarks.peers.mooncake_proc"
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds benchmarks/

_GLOG = re.compile(r"^([IWEF])\d{4} |^WARNING: Logging before")  # glog's line prefix: severity, MMDD
_BENIGN = ("Local segment descriptor not found",)  # logged as an error by every healthy engine


@dataclass(frozen=True)
class MooncakeLimits:
    """The harness's own settings, passed to the client child with the PeerSpec."""

    prefix_fallback_batch: int = 128  # keys per batch_is_exist if the spec's batch fails
    call_timeout_s: float = 20.0  # any one Mooncake call (a dead master answers -900 in ~4 s)
    setup_timeout_s: float = 20.0  # setup() retries an unreachable master for ~90 s
    prefault: bool = True  # write 85 % of the segment once first (see mooncake_proc)
    server_pids: tuple[int, ...] = field(default=())  # master and server: their CPU is counted

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> MooncakeLimits:
        data = json.loads(text)
        data["server_pids"] = tuple(data.get("server_pids", ()))
        return cls(**data)


class Unavailable(Exception):
    """The baseline cannot go on; the message is the reason shown in the report."""


def version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("mooncake-transfer-engine-non-cuda")
    except metadata.PackageNotFoundError:
        return None


def master_binary() -> str:
    """The real mooncake_master (the console script only execv's it); Unavailable if missing."""
    spec = importlib.util.find_spec("mooncake")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("the mooncake package is not installed (pip install 'kvstore[mooncake]')")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "mooncake_master")
        if os.access(path, os.X_OK):
            return path
    found = shutil.which("mooncake_master", path=os.path.dirname(sys.executable))
    if found is None:
        raise Unavailable("no mooncake_master binary next to the mooncake package")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Child:
    """A started child process. Its stderr (and, for the master, stdout) goes to a log file
    whose tail explains a failure; a `messages` child reports JSON lines on stdout, read by a
    thread so that waiting for the next one can time out."""

    def __init__(self, name: str, argv: list[str], log_dir: str, messages: bool, stdin: bool = False) -> None:
        self.name = name
        self.log_path = os.path.join(log_dir, f"{name}.log")
        env = dict(os.environ, **{PARENT_ENV: str(os.getpid())}, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (CHECKOUT, env.get("PYTHONPATH")) if p)  # for -m benchmarks.…
        with open(self.log_path, "wb") as log:
            try:
                self.popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE if messages else log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                raise Unavailable(f"cannot start the {name} process: {exc}") from exc
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        if messages:
            threading.Thread(target=self._pump, name=f"bench-mooncake-{name}", daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                continue  # not ours; the child sends its own stdout to the log
            if isinstance(message, dict) and "kind" in message:
                self._queue.put(message)
        self._queue.put(None)

    def next_message(self, timeout: float, others: tuple[_Child, ...] = ()) -> dict[str, Any]:
        """The next message; Unavailable if the child ends first, says nothing for `timeout` s, or
        one of `others` (the processes it depends on) exits meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            for other in others:
                if other is not self and not other.alive():
                    raise Unavailable(
                        f"the {other.name} process exited with {other.popen.returncode}{other.log_tail()}"
                    )
            try:
                message = self._queue.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise Unavailable(
                        f"{self.name} process said nothing for {timeout:.0f} s{self.log_tail()}"
                    ) from None
        if message is None:
            raise Unavailable(f"{self.name} process exited with {self._wait_rc()}{self.log_tail()}")
        if message["kind"] == "unavailable":
            raise Unavailable(f"{self.name}: {message.get('reason', '?')}{self.log_tail()}")
        return message

    def expect(self, kind: str, timeout: float, others: tuple[_Child, ...] = ()) -> dict[str, Any]:
        message = self.next_message(timeout, others)
        if message["kind"] != kind:
            raise Unavailable(f"{self.name} process sent {message['kind']!r} before {kind!r}")
        return message

    def _wait_rc(self) -> int | None:
        try:
            return self.popen.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 2) -> str:
        """The log's last error lines (glog E/F lines, or what is not glog, e.g. a Python
        exception), as a suffix for a reason; "" if it has none."""
        try:
            with open(self.log_path, errors="replace") as fh:
                text = fh.read()[-20000:].splitlines()
        except OSError:
            return ""
        errors = [
            ln.strip()
            for ln in text
            if ln.strip()
            and not any(b in ln for b in _BENIGN)
            and ((m := _GLOG.match(ln)) is None or m.group(1) in ("E", "F"))
        ]
        return ("; log: " + " | ".join(ln[:200] for ln in errors[-lines:])) if errors else ""

    def stop(self, grace: float) -> None:
        """Close stdin (a server's cue to close cleanly), wait `grace` s, then SIGTERM, then SIGKILL."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass
        for sig, wait in ((None, grace), (signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            if sig is None and not grace:
                continue
            if self.popen.poll() is not None:
                break
            if sig is not None:
                try:
                    self.popen.send_signal(sig)
                except ProcessLookupError:
                    break
            try:
                self.popen.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        if self.popen.stdout is not None:
            self.popen.stdout.close()


class MooncakeStore:
    """The three processes of one peer run; `measure` starts, drives and stops them."""

    def __init__(
        self,
        spec: PeerSpec,
        progress: Progress,
        limits: MooncakeLimits | None = None,
        silence_timeout_s: float = 180.0,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.spec = spec
        self.progress = progress
        self.limits = limits or MooncakeLimits()
        self.silence_timeout_s = silence_timeout_s  # longest wait for the client's next line
        self.start_timeout_s = start_timeout_s
        self._children: list[_Child] = []
        self._log_dir = ""

    def measure(self) -> PeerOutcome:
        outcome = PeerOutcome()
        started = time.perf_counter()
        self._log_dir = tempfile.mkdtemp(prefix="kvstore-bench-mooncake-")
        finished = False
        try:
            self._run(outcome)
            finished = True
        except Unavailable as exc:
            outcome.unavailable = str(exc)
        finally:  # also on Ctrl-C (KeyboardInterrupt goes on up)
            self._stop_all(clean=finished)
            outcome.seconds = time.perf_counter() - started
            if outcome.unavailable is not None and os.listdir(self._log_dir):
                outcome.unavailable += f" (logs in {self._log_dir})"
            else:
                shutil.rmtree(self._log_dir, ignore_errors=True)
        return outcome

    def _run(self, outcome: PeerOutcome) -> None:
        master = self._start_master()
        child = [sys.executable, "-m", CHILD_MODULE]
        setup_s = str(self.limits.setup_timeout_s)
        server = self._start(
            _Child(
                "server",
                [
                    *child,
                    "server",
                    "--master",
                    master,
                    "--segment",
                    str(self.spec.segment_size),
                    "--setup-timeout",
                    setup_s,
                ],
                self._log_dir,
                messages=True,
                stdin=True,
            )
        )
        others = tuple(self._children)
        server.expect("ready", self.start_timeout_s + self.limits.setup_timeout_s, others)
        limits = replace(self.limits, server_pids=tuple(c.popen.pid for c in self._children))
        argv = [*child, "client", "--master", master, "--spec", self.spec.to_json(), "--limits", limits.to_json()]
        client = self._start(_Child("client", argv, self._log_dir, messages=True))
        others = tuple(self._children)
        ready = client.expect("ready", self.start_timeout_s + self.limits.setup_timeout_s, others)
        outcome.notes.append(f"client setup {ready.get('setup_s', 0) * 1e3:.0f} ms")
        while True:
            message = client.next_message(self.silence_timeout_s, others)
            kind = message.pop("kind")
            if kind == "done":
                return
            if kind == "progress":
                self.progress(f"{PATH} {message['what']}")
            elif kind == "note":
                outcome.notes.append(message["text"])
            elif kind == "result":
                result = from_message(message)
                getattr(outcome.results, _LISTS[type(result).__name__]).append(result)
            elif kind == "skipped":
                outcome.results.skipped.append(Skipped(f"{PATH} {message['what']}", message["reason"]))
                self.progress(f"{PATH} {message['what']} skipped: {message['reason']}")

    def _start(self, proc: _Child) -> _Child:
        self._children.append(proc)
        return proc

    def _start_master(self) -> str:
        """Start mooncake_master on 127.0.0.1 and wait until its RPC port accepts; its address."""
        binary = master_binary()
        rpc_port, metrics_port = _free_port(), _free_port()
        argv = [
            sys.executable,
            "-m",
            CHILD_MODULE,
            "exec",
            binary,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc_port}",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={metrics_port}",
            "--enable_metric_reporting=false",
        ]
        master = self._start(_Child("master", argv, self._log_dir, messages=False))
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if not master.alive():
                raise Unavailable(f"mooncake_master exited with {master.popen.returncode}{master.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", rpc_port), timeout=0.2):
                    return f"127.0.0.1:{rpc_port}"
            except OSError:
                time.sleep(0.05)
        raise Unavailable(
            f"mooncake_master not listening on 127.0.0.1:{rpc_port} after "
            f"{self.start_timeout_s:.0f} s{master.log_tail()}"
        )

    def _stop_all(self, clean: bool) -> None:
        """Client, then server (it unmounts its segment from the master), then master. After a
        failure nobody waits long: a server's close hangs while the master is gone."""
        grace = {"client": 2.0 if clean else 0.0, "server": 10.0 if clean else 1.0, "master": 0.0}
        for proc in sorted(self._children, key=lambda p: list(grace).index(p.name)):
            proc.stop(grace[proc.name])
        self._children.clear()


_LISTS = {"Throughput": "throughput", "Latency": "latency", "PrefixRate": "prefix", "ServerCpu": "server_cpu"}


def describe(spec: PeerSpec) -> str:
    """How the peer runs, for the report."""
    return (
        f"mooncake-transfer-engine-non-cuda {version() or '?'}: mooncake_master + a server process "
        f"({fmt_size(spec.segment_size)} global segment) + a client process, protocol tcp, "
        f"P2PHANDSHAKE, 127.0.0.1; server CPU = master + server"
    )


def measure(spec: PeerSpec, progress: Progress) -> PeerOutcome:
    progress(f"{PATH}: starting mooncake_master, a server ({fmt_size(spec.segment_size)} segment) and a client")
    return MooncakeStore(spec, progress).measure()
