"""Existence checks batched per scheduler step: one store call per step, however many keys.

The scheduler asks `lookup(key)` for every chunk of every waiting request and must not block. A key
seen for the first time is answered "not yet" (None) and queued; `flush()`, called once at the end
of the step, hands the whole step's queue to a thread that asks the store about all of it in one
`exists_many`, while the model runs. The next step's lookups see the answers. A verdict is kept
while a request that asked for it is alive, so a request is not re-asked every step, and is turned
into a miss when a load of that key fails (so the scheduler recomputes rather than retrying it).
A failed store call answers every key of its batch as a miss: a lookup never hangs on the store.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey

log = logging.getLogger(__name__)

Check = Callable[[Sequence[OffloadKey]], list[bool]]


@dataclass(slots=True)
class _Verdict:
    batch: int  # the flush that asked for it: a late answer for a forgotten key is dropped
    found: bool | None = None  # None: not answered yet
    asking: set[str] = field(default_factory=set)  # ids of the requests that asked


class StepLookups:
    """Scheduler-thread API: `lookup`, `flush`, `mark_missing`, `forget`; `check` runs on this
    object's thread. `calls` and `keys_asked` count the store calls made and the keys they asked."""

    def __init__(self, check: Check, name: str = "kvstore-tier-lookup") -> None:
        self._check = check
        self._verdicts: dict[OffloadKey, _Verdict] = {}
        self._by_request: dict[str, set[OffloadKey]] = {}
        self._pending: list[OffloadKey] = []
        self._flushes = 0
        self._todo: queue.SimpleQueue[tuple[int, list[OffloadKey]] | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[int, list[OffloadKey], list[bool]]] = queue.SimpleQueue()
        self._in_flight = 0  # batches handed to the thread and not yet applied
        self._sent = self._answered = 0  # batches handed to the thread, and answered by it
        self._answered_cv = threading.Condition()
        self.calls = 0
        self.keys_asked = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def lookup(self, key: OffloadKey, req_id: str) -> bool | None:
        """True (stored), False (not stored) or None (asked; answer in a later step)."""
        if self._in_flight and not self._answers.empty():
            self._apply_answers()
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = _Verdict(batch=self._flushes)
            self._pending.append(key)
        verdict.asking.add(req_id)
        self._by_request.setdefault(req_id, set()).add(key)
        return verdict.found

    def flush(self) -> None:
        """End of a scheduler step: send the step's new keys to the store in one call."""
        self._apply_answers()
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self._in_flight += 1
        self._sent += 1
        self._todo.put((self._flushes, batch))
        self._flushes += 1

    @property
    def busy(self) -> bool:
        return bool(self._in_flight or self._pending)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until every batch sent has been answered (the answers apply at the next lookup or
        flush); False on timeout. For shutdown and tests: the scheduler never waits."""
        with self._answered_cv:
            return self._answered_cv.wait_for(lambda: self._answered >= self._sent, timeout_s)

    def mark_missing(self, keys: Collection[OffloadKey]) -> None:
        """A load of these keys failed: answer them as misses from now on."""
        for key in keys:
            verdict = self._verdicts.get(key)
            if verdict is not None:
                verdict.found = False

    def forget(self, req_id: str) -> None:
        """A request finished: drop the verdicts only it was holding."""
        for key in self._by_request.pop(req_id, ()):
            verdict = self._verdicts.get(key)
            if verdict is None:
                continue
            verdict.asking.discard(req_id)
            if not verdict.asking and verdict.found is not None:
                del self._verdicts[key]

    def close(self) -> None:
        self._todo.put(None)
        self._thread.join()
        self._apply_answers()

    def _apply_answers(self) -> None:
        while True:
            try:
                batch, keys, found = self._answers.get_nowait()
            except queue.Empty:
                return
            self._in_flight -= 1
            for key, hit in zip(keys, found):
                verdict = self._verdicts.get(key)
                if verdict is None or verdict.batch != batch:
                    continue
                if not verdict.asking:  # every request that asked has finished
                    del self._verdicts[key]
                elif verdict.found is None:
                    verdict.found = hit

    def _run(self) -> None:
        while (item := self._todo.get()) is not None:
            batch, keys = item
            try:
                found = self._check(keys)
            except Exception as exc:  # noqa: BLE001 - the store is down or refused: every key is a miss
                log.warning("kvstore tier: a lookup of %d key(s) failed (%s); treated as misses", len(keys), exc)
                found = [False] * len(keys)
            self.calls += 1
            self.keys_asked += len(keys)
            self._answers.put((batch, keys, found))
            with self._answered_cv:
                self._answered += 1
                self._answered_cv.notify_all()
