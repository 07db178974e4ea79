"""A region reservation that reuses just-freed space is answered only once the old owner's removal
is in the journal (docs/ha.md: space is handed out only once its old owner's removal is durable),
as PutStart is. The journal is a real GroupCommit over a write the test holds on an Event."""

from __future__ import annotations

import threading
from typing import Any

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode
from kvstore.meta.journal import Changes, GroupCommit
from kvstore.meta.state import GRACE_S
from kvstore.meta.store import MetaStore
from kvstore.types import Tier
from tests.meta_helpers import HOST, SIGNER, commit, segment

SEG = 1 << 20
WAIT_S = 30  # a safety net for a hung test, never a threshold: every wait below ends on a signal


class HeldJournal(GroupCommit):
    """A GroupCommit whose writes wait while `hold` is clear; `removing` is set once the write of
    key "old"'s removal has started; `waiting[thread name]` once a thread waits on a ticket."""

    def __init__(self) -> None:
        super().__init__(self._write, "held")
        self.hold = threading.Event()
        self.hold.set()
        self.removing = threading.Event()
        self.removal_written = threading.Event()
        self.waiting: dict[str, threading.Event] = {}

    def _write(self, changes: Changes) -> None:
        removal = changes.objects.get("old", b"") is None
        if removal:
            self.removing.set()
        assert self.hold.wait(WAIT_S)
        if removal:
            self.removal_written.set()

    def wait(self, ticket: int) -> None:
        flag = self.waiting.get(threading.current_thread().name)
        if flag is not None:
            flag.set()
        super().wait(ticket)


def test_a_reservation_reusing_freed_space_waits_for_the_removal_to_be_written():
    clock, journal = FakeClock(), HeldJournal()
    store = MetaStore(MetaConfig(write_grant_ttl_s=10, heartbeat_ttl_s=1000, high_watermark=1.0, low_watermark=0.9),
                      SIGNER, clock, journal=journal)  # fmt: skip
    store.mount_segment(segment("s1", "d1", Tier.DRAM, SEG))
    reply = store.put_start(["old"], [SEG])  # the whole segment
    commit(store, ["old"], reply.results)
    old_offset = reply.results[0].grants[0].offset
    clock.advance(10 + GRACE_S + 1)  # its write grant is long expired: a removal frees it at once
    journal.hold.clear()

    remover = threading.Thread(target=store.remove, args=(["old"],), name="remover")
    remover.start()
    assert journal.removing.wait(WAIT_S)  # the removal is in memory, its write held

    answered: list[Any] = []
    reserving = journal.waiting["reserver"] = threading.Event()
    done = threading.Event()

    def reserve() -> None:
        answered.append(store.regions.reserve("w1", HOST, SEG))
        done.set()

    reserver = threading.Thread(target=reserve, name="reserver")
    reserver.start()
    try:
        # Whichever comes first: the reservation answered, or it waits on the journal.
        assert _either(reserving, done), "the reservation neither answered nor waited on the journal"
        assert not done.is_set(), "a region over the freed space was handed out before its removal was written"
        assert not journal.removal_written.is_set()
    finally:
        journal.hold.set()
        reserver.join(WAIT_S)
        remover.join(WAIT_S)
    assert journal.removal_written.is_set() and done.is_set()
    [region] = answered
    assert region.code is ErrorCode.OK and region.grant.offset == old_offset  # the same space, now
    store.check_invariants()


def _either(a: threading.Event, b: threading.Event) -> bool:
    """Wait until `a` or `b` is set (both threads set theirs before blocking or returning)."""
    either = threading.Event()

    def wait_then_set(event: threading.Event) -> None:
        if event.wait(WAIT_S):
            either.set()

    for event in (a, b):
        threading.Thread(target=wait_then_set, args=(event,), daemon=True).start()
    return either.wait(WAIT_S)
