"""Waiting for SIGINT/SIGTERM in a process whose main thread has nothing else to do.

The kernel may deliver a process-directed signal to any thread that does not block it. CPython's
C-level handler, running on that thread, only flags the signal for the main thread; a main thread
parked in `threading.Event.wait()` (a lock acquire with no timeout) is never woken to run the
Python handler, and the process never stops. The C handler does, however, write the signal's number
to the wakeup fd (`signal.set_wakeup_fd`) on whichever thread it runs. So the main thread waits on
that pipe, which every delivery reaches, whatever thread the kernel picked.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """Installed in the main thread before a server says it is ready, so that a signal sent as soon
    as the ready line is read still stops it. `wait()` returns once one of `signals` arrived."""

    def __init__(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
        self._signals = frozenset(int(s) for s in signals)
        self._received: int | None = None
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        for sig in self._signals:
            # A Python handler makes CPython install its C handler, which writes to the wakeup fd.
            signal.signal(sig, self._note)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def _note(self, signum: int, _frame: object) -> None:
        self._received = signum

    @property
    def received(self) -> int | None:
        """The stop signal taken, if one was."""
        return self._received

    def fileno(self) -> int:
        """Readable once a signal arrived (for `select` or `multiprocessing.connection.wait`)."""
        return self._read

    def poll(self) -> bool:
        """Whether a stop signal has arrived, without waiting (drains the pipe)."""
        if self._received is None:
            try:
                data = os.read(self._read, 512)
            except BlockingIOError:
                data = b""
            for byte in data:
                if byte in self._signals:
                    self._received = byte
        return self._received is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop signal arrives (True) or `timeout` seconds pass (False)."""
        while not self.poll():
            ready, _, _ = select.select([self._read], [], [], timeout)
            if not ready:
                return self.poll()
        return True

    def close(self) -> None:
        """Hand the wakeup fd back; the handlers stay (a late signal is noted, not fatal)."""
        signal.set_wakeup_fd(self._previous_fd)
        os.close(self._read)
        os.close(self._write)
