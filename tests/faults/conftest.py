"""Fault injection against real clusters: every test here is marked `faults` (a quick run skips
them with -m "not faults"); `pytest tests/faults --soak 600` also runs the soak for 600 s."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import Cluster, Proc


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def faults() -> Iterator[Cluster]:
    c = Cluster()
    yield c
    for proc in c.procs:  # never leave one stopped: teardown must be able to end it
        if proc.popen.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
    c.close()


def rss_kib(proc: Proc | subprocess.Popen[Any]) -> int:
    """Resident memory of a process, KiB."""
    pid = proc.pid
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")
