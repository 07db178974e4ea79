"""`kvstore` with a daemon whose transfers can be slowed from outside: a test-only plug-in that the
product does not carry. Run as `python -m tests.observability.throttled serve ...`; the rate, in bytes
a second (0: full speed), is read from the file named by $KVSTORE_TEST_THROTTLE_FILE before every
transfer the daemon admits (tcp and tls requests pass through `DaemonMetrics.admit`)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from kvstore.metrics.daemon import DaemonMetrics
from kvstore.types import GrantMode

RATE_FILE_ENV = "KVSTORE_TEST_THROTTLE_FILE"


def set_rate(path: Path, bytes_per_s: float) -> None:
    """Slow the daemon's next transfers to `bytes_per_s` (0 lifts the throttle)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(bytes_per_s))
    tmp.replace(path)  # whole, never half written


def _rate(path: Path) -> float:
    try:
        return float(path.read_text() or 0)
    except FileNotFoundError:
        return 0.0


def install(path: Path) -> None:
    def admit(self: DaemonMetrics, transport: str, mode: GrantMode, nbytes: int) -> None:
        rate = _rate(path)
        if rate > 0 and nbytes > 0:
            time.sleep(nbytes / rate)  # the throttle is the delay itself

    DaemonMetrics.admit = admit  # type: ignore[method-assign]


if __name__ == "__main__":
    install(Path(os.environ[RATE_FILE_ENV]))
    from kvstore.cli import main

    sys.argv[0] = "kvstore"
    sys.exit(main())
