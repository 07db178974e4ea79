"""The checker can fail: a synthetic history with each kind of violation is reported as exactly
that, and a clean one (failed puts, removes, concurrent writers) passes. No fleet, no root."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fleet.checker import Kind, check
from tests.fleet.history import HistoryWriter, Op, Sighting, read_history, read_sightings, sighting_line

TYPED = {"Unavailable", "TransportError", "KeyNotFound", "NotLeader"}
A, B, C = "d-a", "d-b", "d-c"


def op(
    n: int, kind: str, key: str, t0: float, t1: float | None, ok: bool | None, digest: str | None = None, **kw
) -> Op:
    return Op(f"c:{n}", "c", "t", kind, key, t0, 5.0, kw.pop("phase", "run"), t1, ok, digest, **kw)


def clean() -> list[Op]:
    return [
        op(1, "put", "k1", 0.0, 0.1, True, A),
        op(2, "put", "k2", 0.2, 0.4, False, B, error="Unavailable"),  # failed, yet it may have landed
        op(3, "get", "k2", 0.5, 0.6, True, B),
        op(4, "get", "k1", 0.7, 2.0, False, error="TransportError"),  # a partition: typed, in time
        op(5, "put", "k3", 1.0, 1.1, True, C),
        op(6, "remove", "k3", 1.2, 1.3, True),
        op(7, "get", "k3", 1.4, 1.5, False, error="KeyNotFound"),
        op(8, "get", "k1", 9.0, 9.1, True, A, phase="final"),
    ]


def test_a_clean_history_passes():
    report = check(clean(), TYPED)
    assert report.violations == [], report.summary()
    assert report.acked_puts == 2 and report.lost == 0


def test_each_kind_of_violation_is_reported():
    history = [
        *clean(),
        op(10, "put", "lost", 0.0, 0.1, True, A),
        op(11, "get", "lost", 9.0, 9.1, False, error="KeyNotFound", phase="final"),  # acked, gone
        op(12, "put", "unread", 0.0, 0.1, True, A),  # acked, never read back
        op(13, "get", "k1", 3.0, 3.1, True, B),  # another key's bytes
        op(14, "get", "never", 3.0, 3.1, True, A),  # a key nobody wrote
        op(15, "put", "gone", 0.0, 0.1, True, C),
        op(16, "remove", "gone", 1.0, 1.1, True),
        op(17, "get", "gone", 2.0, 2.1, True, C),  # back after an acknowledged remove
        op(18, "get", "k1", 4.0, 4.2, False, error="ConnectionResetError"),
        op(19, "get", "k1", 4.0, 12.0, False, error="Unavailable"),  # 8 s against a 5 s deadline
        op(20, "get", "k1", 5.0, None, None),
    ]
    report = check(history, TYPED)
    found = {(v.kind, v.op_id) for v in report.violations}
    assert found == {
        (Kind.LOST, "c:10"),
        (Kind.LOST, "c:12"),
        (Kind.UNWRITTEN_READ, "c:13"),
        (Kind.UNWRITTEN_READ, "c:14"),
        (Kind.RESURRECTED, "c:17"),
        (Kind.UNTYPED, "c:18"),
        (Kind.LATE, "c:19"),
        (Kind.HUNG, "c:20"),
    }, report.summary()
    assert report.lost == 2


def test_explained_absences_are_not_losses():
    history = [
        op(1, "put", "evicted", 0.0, 0.1, True, A),
        op(2, "put", "removed", 0.0, 0.1, True, B),
        op(3, "remove", "removed", 0.5, 0.6, False, error="Unavailable"),  # may have removed it
        op(4, "put", "again", 0.0, 0.1, True, C),
        op(5, "remove", "again", 0.2, 0.3, True),
        op(6, "put", "again", 0.25, 0.5, True, C),  # overlaps the remove: may land after it
        op(7, "get", "again", 1.0, 1.1, True, C),
        op(8, "get", "again", 9.0, 9.1, True, C, phase="final"),  # c:6 began after the remove: kept
    ]
    report = check(history, TYPED, evicted={"evicted"})
    assert report.violations == [], report.summary()


def test_histories_round_trip_through_jsonl(tmp_path: Path):
    path = tmp_path / "c.jsonl"
    writer = HistoryWriter(path, "c", "t")
    put = writer.invoke("put", "k", 5.0, put_digest=A)
    writer.complete(put, True, leader="10.0.0.2:1")
    get = writer.invoke("get", "k", 5.0)
    writer.complete(get, False, error=TimeoutError("raw"))
    writer.invoke("get", "k", 5.0, phase="final")  # its writer died here
    writer.close()
    with path.open("a") as fh:
        fh.write(json.dumps({"event": "complete", "id": "c:3"})[:10])  # a line cut short
    ops = read_history([path])
    assert [(o.op, o.ok, o.error, o.leader) for o in ops] == [
        ("put", True, None, "10.0.0.2:1"),
        ("get", False, "TimeoutError", None),
        ("get", None, None, None),
    ]
    kinds = {v.kind for v in check(ops, TYPED).violations}
    assert kinds == {Kind.UNTYPED, Kind.HUNG, Kind.LOST}


OLD, NEW = "10.0.0.2:1", "10.0.0.3:1"


def sightings() -> list[Sighting]:
    """OLD leads epoch 1; NEW is seen leading epoch 2 at 10.0-10.1; OLD leads again, epoch 3, seen
    at 30.0-30.1 (at 20.0 it still stood by)."""
    return [
        Sighting(OLD, "leader", 1, 0.0, 0.1),
        Sighting(NEW, "standby", 1, 0.0, 0.1),
        Sighting(NEW, "leader", 2, 10.0, 10.1),
        Sighting(OLD, "standby", 2, 20.0, 20.1),
        Sighting(OLD, "leader", 3, 30.0, 30.1),
    ]


def test_a_clean_handover_passes():
    history = [
        op(1, "put", "k", 1.0, 1.1, True, A, leader=OLD),
        op(2, "get", "k", 9.9, 10.5, True, A, leader=OLD),  # asked before NEW led, read within the grant
        op(3, "put", "k2", 10.2, 10.3, True, B, leader=NEW),
        op(4, "get", "k2", 31.0, 31.1, True, B, leader=OLD),  # OLD leads again
        op(5, "get", "k", 40.0, 40.1, True, A, leader=OLD, phase="final"),
        op(6, "get", "k2", 40.0, 40.1, True, B, leader=OLD, phase="final"),
        op(7, "get", "k", 12.0, 12.1, False, error="Unavailable", leader=OLD),  # failed: no answer
        op(8, "get", "k", 10.5, 11.0, True, A, leader=OLD, fresh=False),  # on a cached grant, in time
    ]
    report = check(history, TYPED, sightings=sightings(), grant_s=2.0)
    assert report.violations == [], report.summary()


def test_each_kind_of_leadership_violation_is_reported():
    history = [
        op(1, "put", "k", 1.0, 1.1, True, A, leader=OLD),
        op(2, "get", "k", 12.0, 12.1, True, A, leader=OLD),  # OLD answered after NEW led: a stale read
        op(3, "put", "k2", 15.0, 15.1, True, B, leader=OLD),  # ... and a write outside its lease
        op(4, "get", "k", 9.0, 14.0, True, A, leader=OLD),  # OLD's grant honoured 3.9 s after NEW led
        op(7, "get", "k", 13.0, 13.5, True, A, leader=OLD, fresh=False),  # a cached grant, expired
        op(5, "get", "k", 40.0, 40.1, True, A, leader=OLD, phase="final"),
        op(6, "get", "k2", 40.0, 40.1, True, B, leader=OLD, phase="final"),
    ]
    two = [*sightings(), Sighting(OLD, "leader", 2, 10.5, 10.6)]  # both claim epoch 2
    report = check(history, TYPED, sightings=two, grant_s=2.0)
    found = {(v.kind, v.op_id) for v in report.violations}
    assert found == {
        (Kind.SPLIT_BRAIN, "epoch 2"),
        (Kind.STALE_LEADER, "c:2"),
        (Kind.STALE_LEADER, "c:3"),
        (Kind.GRANT_PAST_LEASE, "c:4"),
        (Kind.GRANT_PAST_LEASE, "c:7"),
    }, report.summary()
    assert report.stale_reads == 3


def test_sightings_round_trip_and_histories_skip_them(tmp_path: Path):
    path = tmp_path / "roles.jsonl"
    path.write_text("".join(sighting_line(s) + "\n" for s in sightings()) + '{"event": "sigh')
    assert read_sightings([path]) == sightings()
    assert read_history([path]) == []
