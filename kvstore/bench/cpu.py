"""CPU time used by other processes on this host, at nanosecond resolution (Linux).

/proc/PID/stat counts in clock ticks (10 ms), too coarse for a loop of a few hundred calls; each
thread's schedstat counts the nanoseconds it ran. Threads that exit between two readings are
lost, which the servers measured here do not do while a loop runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) all live threads of `pid` have run; 0.0 once it is gone."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


class CpuMeter:
    """A clock of the CPU seconds a fixed set of processes has used."""

    def __init__(self, pids: Sequence[int], what: str) -> None:
        self.pids = tuple(pids)
        self.what = what  # e.g. "meta + daemon", for the report

    def __call__(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.pids)

    @staticmethod
    def available() -> bool:
        return os.path.exists(f"/proc/{os.getpid()}/task")
