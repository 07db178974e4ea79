"""The store under test as real processes: a metadata service and one storage daemon.

Each is started as `python -m kvstore.cli ...` on port 0 and waited for by its readiness line
(`kvstore ready: meta=HOST:PORT` / `kvstore ready: daemon=...`), never by sleeping. Both get the
same random KVSTORE_SECRET so the daemon accepts the service's grants.
"""

from __future__ import annotations

import collections
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

from kvstore.config import random_secret

READY = re.compile(r"kvstore ready: (\w+)=(\S+)")
_TAIL_LINES = 50


class ServerProcess:
    """One started kvstore process; its output is drained (and its tail kept) so it never blocks."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "kvstore.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, name=f"bench-pump-{self.popen.pid}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.tail.append(line)
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout: float) -> str:
        """The value after `kvstore ready: NAME=`; RuntimeError if the process exits or times out first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError(
                    f"kvstore {' '.join(self.args)} not ready within {timeout:.0f} s:\n" + "".join(self.tail)
                ) from None
            if line is None:
                raise RuntimeError(
                    f"kvstore {' '.join(self.args)} exited with {self.popen.wait()}:\n" + "".join(self.tail)
                )
            if m := READY.search(line):
                return m.group(2)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a clean shutdown, which removes the daemon's segment files); SIGKILL if it hangs."""
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)


class LocalStore:
    """A metadata service plus one daemon on this host; a context manager that stops both."""

    def __init__(
        self,
        dram: int,
        segment_size: int,
        daemon_args: tuple[str, ...] = (),
        ready_timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.dram = dram
        self.segment_size = segment_size
        self.daemon_args = daemon_args  # more `kvstore daemon` flags, e.g. an SSD tier
        self.ready_timeout = ready_timeout
        self.env = env or {}  # e.g. KVSTORE_META_* settings for this run
        self.meta_address = ""
        self.procs: list[ServerProcess] = []

    def start(self) -> LocalStore:
        env = dict(os.environ, KVSTORE_SECRET=random_secret(), PYTHONUNBUFFERED="1", **self.env)
        try:
            meta = self._spawn(["meta", "--port", "0"], env)
            self.meta_address = meta.wait_ready(self.ready_timeout)
            daemon = self._spawn(
                [
                    "daemon",
                    "--meta",
                    self.meta_address,
                    "--dram",
                    str(self.dram),
                    "--segment-size",
                    str(self.segment_size),
                    *self.daemon_args,
                ],
                env,
            )
            daemon.wait_ready(self.ready_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _spawn(self, args: list[str], env: dict[str, str]) -> ServerProcess:
        proc = ServerProcess(args, env)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):  # the daemon first, so it can unmount from the service
            proc.stop()
        self.procs.clear()

    def __enter__(self) -> LocalStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
