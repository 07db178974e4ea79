"""A leadership watch: a thread per metadata service asks it ServiceInfo every `period_s`, from the
root namespace (no partition cuts it off from any host), and appends what it said, with when it
was asked and when it answered, to a JSONL file (history.Sighting lines) for the checker's
leadership properties. A service that does not answer (stopped, or past its lease) adds nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType

from kvstore.errors import KVStoreError
from kvstore.metaclient.client import MetaClient
from kvstore.wire.calls import ServiceInfo
from tests.cluster import ADMIN_TOKEN
from tests.fleet.history import Sighting, sighting_line


class LeaderWatch:
    def __init__(self, services: list[str], path: Path, period_s: float = 0.05) -> None:
        self.path, self.period_s = path, period_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._fh = path.open("a")
        self._threads = [threading.Thread(target=self._watch, args=(s,), daemon=True) for s in services]

    def __enter__(self) -> LeaderWatch:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        with self._lock:
            if not self._fh.closed:
                self._fh.close()

    def _watch(self, service: str) -> None:
        with MetaClient(service, timeout_s=1, token=ADMIN_TOKEN) as meta:
            while not self._stop.is_set():
                invoke = time.monotonic()
                try:
                    info = meta.call(ServiceInfo())
                except KVStoreError:
                    self._stop.wait(self.period_s)
                    continue  # no answer: nothing seen
                seen = Sighting(service, info.role, info.epoch, invoke, time.monotonic())
                with self._lock:
                    if self._fh.closed:
                        return
                    self._fh.write(sighting_line(seen) + "\n")
                    self._fh.flush()
                self._stop.wait(self.period_s)
