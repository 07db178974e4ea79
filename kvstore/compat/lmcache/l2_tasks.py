"""The non-blocking half of LMCache's L2 adapter interface: task ids, a worker pool that runs each
task, the finished results waiting to be collected, and the event fd signalled when one finishes.

A task is submitted from one of LMCache's controller threads and runs on a pool thread; its
result is recorded before its fd is signalled, so a controller woken by the fd always finds it.
Each result is handed out exactly once (`pop` / `pop_all`). A task that raises still finishes:
with the result its `on_error` gives, so LMCache never waits for a task that died.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)
R = TypeVar("R")


class Notifier(Protocol):
    """LMCache's EventNotifier (lmcache.v1.platform): a poll-able fd."""

    def fileno(self) -> int: ...
    def notify(self) -> None: ...
    def close(self) -> None: ...


class TaskIds:
    """One sequence of task ids for all of an adapter's boards (thread safe: itertools.count is)."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def next(self) -> int:
        return next(self._next)


class TaskBoard(Generic[R]):
    """One kind of task (store, lookup-and-lock or load): where its results wait, and its fd."""

    def __init__(self, name: str, notifier: Notifier, pool: ThreadPoolExecutor, ids: TaskIds) -> None:
        self.name = name
        self._notifier = notifier
        self._pool = pool
        self._ids = ids
        self._lock = threading.Lock()
        self._done: dict[int, R] = {}
        self._running = 0

    def fileno(self) -> int:
        return self._notifier.fileno()

    def submit(self, work: Callable[[], R], on_error: Callable[[BaseException], R]) -> int:
        """Run `work` on the pool; its result (or `on_error(exc)`) is kept under the returned id."""
        task_id = self._ids.next()
        with self._lock:
            self._running += 1
        self._pool.submit(self._run, task_id, work, on_error)
        return task_id

    def _run(self, task_id: int, work: Callable[[], R], on_error: Callable[[BaseException], R]) -> None:
        try:
            result = work()
        except Exception as exc:  # a task must finish whatever happened in it
            log.warning("kvstore L2 %s task %d failed: %s", self.name, task_id, exc, exc_info=True)
            result = on_error(exc)
        with self._lock:
            self._done[task_id] = result
            self._running -= 1
        self._notifier.notify()

    def pop(self, task_id: int) -> R | None:
        """The task's result, once; None while it runs (or after it was handed out)."""
        with self._lock:
            return self._done.pop(task_id, None)

    def pop_all(self) -> dict[int, R]:
        with self._lock:
            done, self._done = self._done, {}
        return done

    def running(self) -> int:
        with self._lock:
            return self._running

    def close(self) -> None:
        self._notifier.close()
