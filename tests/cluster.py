"""Real kvstore processes for tests: started on port 0, waited for by their readiness line."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import cast

READY = re.compile(r"kvstore ready: (.*)")
SECRET = "tests-shared-secret-0123456789"
ADMIN_TOKEN = "kvsa_tests-operator-token-0123456789"


def found(pattern: str | re.Pattern[str], text: str) -> re.Match[str]:
    """re.search that fails the test, showing the text, where the pattern is not in it."""
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not in:\n{text}"
    return match


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    ready_line: str
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def args(self) -> list[str]:
        """The command line (spawn starts it from a list of str)."""
        return cast("list[str]", self.popen.args)

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM, as Ctrl-C would: a clean shutdown."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            # Ask for every thread's stack (PYTHONFAULTHANDLER, set in _env) so the report shows where it hung.
            self.popen.send_signal(signal.SIGABRT)
            self.popen.wait(timeout=10)
            deadline = time.monotonic() + 5  # the reader thread may still be taking in the stacks
            while not any("most recent call first" in line for line in self.lines) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise TimeoutError(
                f"{self.args[3:]} did not stop within 20 s of SIGTERM; what it printed, "
                f"its threads' stacks last:\n{''.join(self.lines)[-20000:]}"
            ) from None


def authed_channel(address: str, token: str = ADMIN_TOKEN):
    """A plain gRPC channel whose every call carries `token` (for tests that speak raw protobuf)."""
    import grpc

    class _Bearer(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            metadata = [*(details.metadata or ()), ("authorization", f"Bearer {token}")]
            return continuation(details._replace(metadata=metadata), request)

    return grpc.intercept_channel(grpc.insecure_channel(address), _Bearer())


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(
        os.environ, KVSTORE_SECRET=SECRET, KVSTORE_TOKEN=ADMIN_TOKEN, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1"
    )
    env.update(extra or {})
    return env


def spawn(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 60.0, module: str = "kvstore.cli"
) -> Proc:
    """Start `kvstore ARGS` (`python -m MODULE ARGS`: a test's wrapper of the CLI may stand in) and
    return once it prints its readiness line."""
    popen = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(env),
    )
    lines: queue.Queue[str | None] = queue.Queue()
    proc = Proc(popen, "")
    stdout = popen.stdout
    assert stdout is not None  # stdout=PIPE

    def pump() -> None:
        for line in stdout:
            proc.lines.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            popen.kill()
            raise TimeoutError(f"kvstore {' '.join(args)} not ready in {timeout}s:\n{''.join(proc.lines)}") from None
        if line is None:
            raise RuntimeError(f"kvstore {' '.join(args)} exited ({popen.wait()}):\n{''.join(proc.lines)}")
        if m := READY.search(line):
            proc.ready_line = m.group(1)
            return proc


class Cluster:
    """Processes started by a test; all are killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    def meta(self, env: dict[str, str] | None = None, *extra: str) -> tuple[Proc, str]:
        proc = spawn(["meta", "--port", "0", *extra], env)
        self.procs.append(proc)
        return proc, found(r"meta=(\S+)", proc.ready_line).group(1)

    def daemon(self, meta_address: str, dram: str = "256MiB", env: dict[str, str] | None = None, *extra: str) -> Proc:
        proc = spawn(["daemon", "--meta", meta_address, "--dram", dram, *extra], env)
        self.procs.append(proc)
        return proc

    def serve(self, dram: str = "256MiB", *extra: str, env: dict[str, str] | None = None) -> tuple[Proc, str]:
        """`kvstore serve`, without an SSD tier unless `extra` names an --ssd-dir."""
        ssd = [] if "--ssd-dir" in extra else ["--ssd-dir", ""]
        proc = spawn(["serve", "--port", "0", "--dram", dram, *ssd, *extra], env)
        self.procs.append(proc)
        return proc, found(r"meta=(\S+)", proc.ready_line).group(1)

    def close(self) -> None:
        for proc in reversed(self.procs):
            try:
                proc.stop()
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    """Poll `predicate` (a readiness check, not a sleep-for-luck) until true or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)
