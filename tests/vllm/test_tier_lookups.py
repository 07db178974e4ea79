"""StepLookups: a scheduler step's existence checks go to the store in one call, off the
scheduler's thread, and nothing the store does can make a lookup block or lie."""

from __future__ import annotations

import threading

import pytest

from tests.vllm.conftest import needs_vllm

pytestmark = [needs_vllm, pytest.mark.timeout(60)]

if not needs_vllm.args[0]:
    from vllm.v1.kv_offload.base import make_offload_key

    from kvstore.engines.vllm.tier.lookups import StepLookups


def _key(i: int):
    return make_offload_key(i.to_bytes(16, "big"), 0)


class Store:
    """Answers from a set; records each call's keys; can be held or made to fail."""

    def __init__(self, stored=()):
        self.stored = set(stored)
        self.calls: list[list[bytes]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self, keys):
        self.gate.wait(10)
        self.calls.append(list(keys))
        if self.fail:
            raise ConnectionError("the store is down")
        return [k in self.stored for k in keys]


def test_one_call_per_step_for_every_request_and_key():
    store = Store({_key(i) for i in range(0, 100, 2)})
    lookups = StepLookups(store)
    try:
        first = [lookups.lookup(_key(i), f"req-{i % 5}") for i in range(100)]
        assert first == [None] * 100  # asked, not answered: the scheduler does not wait
        lookups.lookup(_key(3), "req-9")  # asked twice in a step: asked of the store once
        lookups.flush()
        assert lookups.wait(10)
        assert [lookups.lookup(_key(i), f"req-{i % 5}") for i in range(100)] == [i % 2 == 0 for i in range(100)]
        assert len(store.calls) == 1 and len(store.calls[0]) == 100
        lookups.flush()  # no new keys: no call
        assert lookups.wait(10) and len(store.calls) == 1
    finally:
        lookups.close()


def test_a_step_does_not_wait_for_a_slow_store():
    store = Store({_key(1)})
    store.gate.clear()  # the store sits on the call
    lookups = StepLookups(store)
    try:
        assert lookups.lookup(_key(1), "r") is None
        lookups.flush()
        assert lookups.lookup(_key(1), "r") is None  # still unanswered: the scheduler moves on
        assert lookups.busy
        store.gate.set()
        assert lookups.wait(10)
        assert lookups.lookup(_key(1), "r") is True
    finally:
        store.gate.set()
        lookups.close()


def test_a_failed_store_call_answers_misses():
    store = Store({_key(1)})
    store.fail = True
    lookups = StepLookups(store)
    try:
        lookups.lookup(_key(1), "r")
        lookups.flush()
        assert lookups.wait(10)
        assert lookups.lookup(_key(1), "r") is False
    finally:
        lookups.close()


def test_a_failed_load_turns_a_hit_into_a_miss():
    lookups = StepLookups(Store({_key(1)}))
    try:
        lookups.lookup(_key(1), "r")
        lookups.flush()
        assert lookups.wait(10)
        assert lookups.lookup(_key(1), "r") is True
        lookups.mark_missing([_key(1)])
        assert lookups.lookup(_key(1), "r") is False
    finally:
        lookups.close()


def test_verdicts_go_with_the_last_request_that_asked():
    store = Store({_key(1)})
    lookups = StepLookups(store)
    try:
        lookups.lookup(_key(1), "a")
        lookups.lookup(_key(1), "b")
        lookups.flush()
        assert lookups.wait(10)
        lookups.forget("a")
        assert lookups.lookup(_key(1), "b") is True  # b still holds the verdict: no new call
        lookups.forget("b")
        store.stored.clear()  # removed from the store meanwhile
        assert lookups.lookup(_key(1), "c") is None  # asked afresh
        lookups.flush()
        assert lookups.wait(10)
        assert lookups.lookup(_key(1), "c") is False
        assert len(store.calls) == 2
    finally:
        lookups.close()


def test_an_answer_for_a_finished_request_is_dropped():
    store = Store({_key(1)})
    store.gate.clear()
    lookups = StepLookups(store)
    try:
        lookups.lookup(_key(1), "a")
        lookups.flush()
        lookups.forget("a")  # finished while its lookup was in flight
        store.stored.clear()
        store.gate.set()
        assert lookups.wait(10)
        lookups.flush()  # applies the stale answer: dropped
        assert lookups.lookup(_key(1), "b") is None  # not the stale True: asked again
    finally:
        store.gate.set()
        lookups.close()
