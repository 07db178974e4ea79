"""A batch of MAX_BATCH_KEYS keys holds the store's lock one slice at a time: another caller is
served between two of the batch's slices, whatever the machine's speed (the process-level check,
with real timing, is tests/faults/test_resource_faults.py)."""

from __future__ import annotations

import threading

import pytest

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.meta.store import SLICE, MetaStore
from kvstore.types import MAX_BATCH_KEYS, Tier
from tests.meta_helpers import SIGNER, commit, segment


class TurnTaking:
    """Stands in for the store's lock: counts the batch thread's outermost holds and, when the
    first of them ends, runs `other` on another thread and waits for it. If the batch held the lock
    for all its keys, `other` would run only after the batch's last hold."""

    def __init__(self, lock: threading.RLock, other) -> None:
        self._lock, self._other = lock, other
        self.batch: threading.Thread | None = None
        self.holds = 0
        self.holds_when_other_ran: int | None = None
        self._depth = threading.local()

    def acquire(self, *args, **kwargs) -> bool:
        got = self._lock.acquire(*args, **kwargs)
        if got:
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            if depth == 0 and threading.current_thread() is self.batch:
                self.holds += 1
        return got

    def release(self) -> None:
        self._depth.n -= 1
        outermost = self._depth.n == 0
        self._lock.release()
        if outermost and threading.current_thread() is self.batch and self.holds_when_other_ran is None:
            self.holds_when_other_ran = self.holds
            helper = threading.Thread(target=self._other)
            helper.start()
            helper.join(timeout=30)
            assert not helper.is_alive(), "the other caller did not get the lock"

    def __enter__(self) -> TurnTaking:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@pytest.mark.parametrize("call", ["put_start", "put_end", "exists"])
def test_another_caller_is_served_between_a_maximum_batchs_slices(call):
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(segment("dram", "d1", Tier.DRAM, 64 << 20))
    keys = [f"big/{i}" for i in range(MAX_BATCH_KEYS)]
    if call != "put_start":
        started = store.put_start(keys, [1] * len(keys)).results
        if call == "exists":
            commit(store, keys, started)
    answered: list[bool] = []
    turns = TurnTaking(store._lock, lambda: answered.extend(store.exists(["elsewhere"])))
    store._lock = turns  # type: ignore[assignment]  # a stand-in for its RLock, on purpose
    turns.batch = threading.current_thread()
    if call == "put_start":
        store.put_start(keys, [1] * len(keys))
    elif call == "put_end":
        commit(store, keys, started)
    else:
        assert store.exists(keys) == [True] * len(keys)
    assert answered == [False]
    # The other caller was served once the batch's first hold ended, and that hold was one of many:
    # at most SLICE keys each, and a slice is small (a few milliseconds of work, not the batch).
    assert turns.holds_when_other_ran == 1
    assert SLICE <= 256 and turns.holds >= MAX_BATCH_KEYS // SLICE
    store._lock = turns._lock
    store.check_invariants()
