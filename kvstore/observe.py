"""The seams the data plane reports through, with do-nothing defaults.

Transports, the grant checker and the SSD tier call these on every request, so they live apart
from prometheus_client: a daemon started without metrics pays one attribute lookup and an empty
call, and nothing here imports more than the standard library.
"""

from __future__ import annotations

from typing import Protocol

from kvstore.types import GrantMode

METRICS_ENDPOINT = "metrics"  # the endpoint a daemon advertises its /metrics under (not a transport)


class TransferObserver(Protocol):
    def admit(self, transport: str, mode: GrantMode, nbytes: int) -> None:
        """A checked request is about to move `nbytes` (where a transfer may be paced: it may block);
        must not raise."""

    def transferred(self, transport: str, mode: GrantMode, nbytes: int, seconds: float | None) -> None:
        """A request moved `nbytes` in `seconds` (None where the transport cannot time it). Must
        not raise or block."""

    def refused(self, mode: GrantMode, reason: str) -> None:
        """A request's grants were refused; `reason` is one of a few fixed words (see
        GrantChecker). Must not raise or block."""


class SsdIoObserver(Protocol):
    def io(self, op: str, nbytes: int, seconds: float) -> None:
        """The SSD tier read (op "read") or wrote ("write") `nbytes` in `seconds`."""

    def journal_lag(self, seconds: float) -> None:
        """Bytes written to SSD waited `seconds` before a journal record made them recoverable."""


class NoTransfers:
    """The observer of a daemon without metrics."""

    def admit(self, transport: str, mode: GrantMode, nbytes: int) -> None:
        pass

    def transferred(self, transport: str, mode: GrantMode, nbytes: int, seconds: float | None) -> None:
        pass

    def refused(self, mode: GrantMode, reason: str) -> None:
        pass


NO_TRANSFERS = NoTransfers()
