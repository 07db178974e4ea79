"""Identity of this host and liveness of local processes, for same-host transports."""

from __future__ import annotations

import functools
import os
import socket


@functools.cache
def host_id() -> str:
    """Stable for one boot of one machine: same value in every process on this host."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}/{boot}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
