"""Start kvstore, engine and router processes and wait for their readiness lines (never sleep).

Used by `kvstore demo` and the engine tests. Every process is started with `python -m ...` from
this interpreter; `Fleet` stops (then kills) whatever it started, newest first.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

READY = re.compile(r"kvstore ready: (.*)")


@dataclass
class Managed:
    name: str
    popen: subprocess.Popen[str]
    ready: str = ""
    lines: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def field(self, key: str) -> str:
        """A `key=value` of the readiness line, e.g. field("engine") -> "http://127.0.0.1:PORT"."""
        m = re.search(rf"{key}=(\S+)", self.ready)
        if m is None:
            raise KeyError(f"{self.name} announced {self.ready!r}, without {key}=")
        return m.group(1)

    def kill(self) -> None:
        """SIGKILL: no chance to clean up (a crash)."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def launch(
    name: str, module_args: Sequence[str], timeout: float = 120.0, env: dict[str, str] | None = None, echo: bool = False
) -> Managed:
    """Run `python -m MODULE_ARGS...` and return once it prints `kvstore ready: ...`."""
    popen = subprocess.Popen(
        [sys.executable, "-m", *module_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
    )
    proc = Managed(name, popen)
    lines: queue.Queue[str | None] = queue.Queue()
    stdout = popen.stdout
    assert stdout is not None  # stdout=PIPE

    def pump() -> None:
        for line in stdout:
            proc.lines.append(line)
            if echo:
                sys.stdout.write(f"  [{name}] {line}")
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name=f"pump-{name}", daemon=True).start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            popen.kill()
            raise TimeoutError(f"{name} not ready in {timeout}s:\n{''.join(proc.lines)}") from None
        if line is None:
            raise RuntimeError(f"{name} exited ({popen.wait()}) before it was ready:\n{''.join(proc.lines)}")
        if m := READY.search(line):
            proc.ready = m.group(1)
            return proc


class Fleet:
    """The processes of one run; `close()` (or leaving the `with`) stops them newest first."""

    def __init__(self, echo: bool = False) -> None:
        self.procs: list[Managed] = []
        self.echo = echo

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(
        self, name: str, module_args: Sequence[str], *, timeout: float = 120.0, env: dict[str, str] | None = None
    ) -> Managed:
        proc = launch(name, module_args, timeout=timeout, env=env, echo=self.echo)
        self.procs.append(proc)
        return proc

    def store(self, dram: str = "512MiB", *extra: str) -> tuple[Managed, str]:
        # shm and tcp are the transports every install has; optional ones come from `extra`. No
        # SSD tier unless `extra` names one: the default directory is shared by every run on the
        # host, and KV it kept from an earlier run would turn this run's misses into hits.
        proc = self.add(
            "store",
            ["kvstore.cli", "serve", "--port", "0", "--dram", dram, "--transports", "shm,tcp", "--ssd-dir", "", *extra],
        )
        return proc, proc.field("meta")

    def engine(
        self,
        role: str,
        meta: str | None = None,
        *extra: str,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> tuple[Managed, str]:
        args = ["kvstore.engines.reference", "--role", role, "--port", "0", *extra]
        if meta:
            args += ["--meta", meta]
        proc = self.add(name or role, args, env=env)
        return proc, proc.field("engine")

    def router(
        self,
        prefill: Sequence[str] = (),
        decode: Sequence[str] = (),
        colocated: Sequence[str] = (),
        meta: str | None = None,
        *extra: str,
        name: str = "router",
        timeout: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> tuple[Managed, str]:
        args = ["kvstore.engines.router", "--port", "0", *extra]
        for flag, urls in (("--prefill", prefill), ("--decode", decode), ("--colocated", colocated)):
            for url in urls:
                args += [flag, url]
        if meta:
            args += ["--meta", meta]
        proc = self.add(name, args, timeout=timeout, env=env)
        return proc, proc.field("router")

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
