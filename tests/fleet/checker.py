"""The checker: what a fault run's history (tests/fleet/history.py) must show, whatever the faults.

1. LOST: every acknowledged put is read back at the end (phase "final") with its exact bytes,
   unless a remove of the key was invoked after it, or the service logged the key's eviction.
2. UNWRITTEN_READ: no read returned bytes that no put of that key (acknowledged, failed or never
   completed: any of them may have landed) invoked before the read completed was writing.
3. RESURRECTED: after an acknowledged remove, no read invoked later returns bytes, unless a put of
   the key that may have landed after the remove began (invoked before the read completed, and
   not completed before the remove was invoked) wrote them.
4. UNTYPED / LATE / HUNG: every error is one of the store's typed errors (names given by the
   caller), every operation completes within its deadline (plus a slack), and none never returns.
5. SPLIT_BRAIN / STALE_LEADER / GRANT_PAST_LEASE, from the sightings of a leadership watch
   (history.Sighting): no two services led the same epoch; no operation was answered by a service
   invoked after another was seen leading at a newer epoch (its lease had ended: the new leader
   was elected over it), until it was elected again; and none answered by it completed later than
   that sighting plus the longest grant lifetime (a grant it signed expires no later than its
   lease's end plus a grant lifetime: past that, a daemon honoured an expired grant, or a commit
   was accepted outside the lease). An operation's service is the address that answered its last
   metadata call (Op.leader); a read on cached locations (not Op.fresh) is held to the grant's
   lifetime only.

Imports nothing from kvstore: the caller passes the typed error names and the evicted keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import Enum

from tests.fleet.history import Op, Sighting


class Kind(Enum):
    LOST = "an acknowledged put is not readable with its bytes at the end"
    UNWRITTEN_READ = "a read returned bytes no put of that key wrote"
    RESURRECTED = "a removed key came back"
    UNTYPED = "an error that is not a typed store error"
    LATE = "an operation returned after its deadline"
    HUNG = "an operation never returned"
    SPLIT_BRAIN = "two services led the same epoch"
    STALE_LEADER = "a service answered after another was elected over it"
    GRANT_PAST_LEASE = "an operation on a deposed leader's grant completed past the grant's lifetime"


@dataclass(frozen=True)
class Violation:
    kind: Kind
    key: str
    op_id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.name} {self.key} ({self.op_id}): {self.detail}"


@dataclass(frozen=True)
class Report:
    ops: int
    acked_puts: int
    violations: list[Violation] = field(default_factory=list)

    def of(self, kind: Kind) -> list[Violation]:
        return [v for v in self.violations if v.kind is kind]

    @property
    def lost(self) -> int:
        """Acknowledged puts lost."""
        return len(self.of(Kind.LOST))

    @property
    def stale_reads(self) -> int:
        """Reads answered by a service after another was elected over it (or on its expired grant)."""
        stale = (Kind.STALE_LEADER, Kind.GRANT_PAST_LEASE)
        return len([v for v in self.violations if v.kind in stale and v.detail.startswith("get")])

    def summary(self) -> str:
        head = f"{self.ops} ops, {self.acked_puts} acknowledged puts, {len(self.violations)} violations"
        return "\n".join([head, *(f"  {v}" for v in self.violations[:50])])


def check(
    ops: Iterable[Op],
    typed_errors: Collection[str],
    evicted: Collection[str] = (),
    slack_s: float = 1.0,
    sightings: Iterable[Sighting] = (),
    grant_s: float = 0.0,
) -> Report:
    """Check a history (every client's operations, final read-back included) against 1-5 above.
    `grant_s`: the longest lifetime of a grant the service signs (read lease or write grant)."""
    ops = list(ops)
    by_key: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[op.key].append(op)
    violations: list[Violation] = []
    for op in ops:
        violations += _timely(op, typed_errors, slack_s)
    acked = 0
    for key, key_ops in by_key.items():
        puts = [o for o in key_ops if o.op == "put"]
        removes = [o for o in key_ops if o.op == "remove"]
        reads = [o for o in key_ops if o.op == "get" and o.ok and o.digest is not None]
        for read in reads:
            violations += _read_was_written(read, puts, removes)
        for put in puts:
            if put.ok:
                acked += 1
                violations += _readable_at_end(put, key_ops, removes, key in evicted)
    violations += _leadership(ops, list(sightings), grant_s, slack_s)
    return Report(len(ops), acked, violations)


def _timely(op: Op, typed_errors: Collection[str], slack_s: float) -> list[Violation]:
    if op.complete is None:
        return [Violation(Kind.HUNG, op.key, op.id, f"{op.op} invoked at {op.invoke:.3f} never completed")]
    out = []
    took = op.complete - op.invoke
    if took > op.deadline_s + slack_s:
        out.append(Violation(Kind.LATE, op.key, op.id, f"{op.op} took {took:.2f} s, deadline {op.deadline_s} s"))
    if not op.ok and op.error not in typed_errors:
        out.append(Violation(Kind.UNTYPED, op.key, op.id, f"{op.op} raised {op.error}: {op.message}"))
    return out


def _read_was_written(read: Op, puts: list[Op], removes: list[Op]) -> list[Violation]:
    assert read.complete is not None
    writers = [p for p in puts if p.digest == read.digest and p.invoke < read.complete]
    if not writers:
        return [Violation(Kind.UNWRITTEN_READ, read.key, read.id, f"read {read.digest}, which no put of the key wrote")]
    for rm in removes:
        acknowledged_before = rm.ok and rm.complete is not None and read.invoke > rm.complete
        if acknowledged_before and not any(p.complete is None or p.complete > rm.invoke for p in writers):
            return [Violation(Kind.RESURRECTED, read.key, read.id, f"read after remove {rm.id} acknowledged")]
    return []


def _readable_at_end(put: Op, key_ops: list[Op], removes: list[Op], evicted: bool) -> list[Violation]:
    if evicted or any(rm.invoke > put.invoke for rm in removes):
        return []
    finals = [o for o in key_ops if o.op == "get" and o.phase == "final"]
    if any(f.ok and f.digest == put.digest for f in finals):
        return []
    seen = [f.error or f"bytes {f.digest}" for f in finals] or ["not read back at the end"]
    return [Violation(Kind.LOST, put.key, put.id, f"acknowledged put of {put.digest}; at the end: {seen[-1]}")]


def _leadership(ops: list[Op], sightings: list[Sighting], grant_s: float, slack_s: float) -> list[Violation]:
    out = []
    led: dict[int, set[str]] = defaultdict(set)
    for s in sightings:
        if s.role == "leader":
            led[s.epoch].add(s.service)
    for epoch, services in sorted(led.items()):
        if len(services) > 1:
            out.append(Violation(Kind.SPLIT_BRAIN, "", f"epoch {epoch}", f"led by {sorted(services)}"))
    deposed = {service: _deposed(service, sightings) for service in {o.leader for o in ops if o.leader}}
    for op in ops:
        if not op.ok or op.leader is None or op.complete is None:
            continue
        for since, until, by in deposed[op.leader]:
            if op.complete >= until:
                continue
            if op.invoke > since and op.fresh:
                detail = f"{op.op} answered by {op.leader}, invoked {op.invoke - since:.2f} s after {by} led"
                out.append(Violation(Kind.STALE_LEADER, op.key, op.id, detail))
            elif op.complete > since + grant_s + slack_s:
                detail = f"{op.op} answered by {op.leader} completed {op.complete - since:.2f} s after {by} led"
                out.append(Violation(Kind.GRANT_PAST_LEASE, op.key, op.id, detail))
            else:
                continue
            break  # one violation per operation
    return out


def _deposed(service: str, sightings: list[Sighting]) -> list[tuple[float, float, str]]:
    """When `service` was no leader for sure: (since, until, who led), from each sighting of
    another service leading at an epoch newer than any `service` had been seen leading, until the
    last sighting of `service` before it was seen leading at a newer epoch still."""
    out = []
    own = [s for s in sightings if s.service == service]
    firsts: dict[tuple[str, int], Sighting] = {}
    for s in sightings:
        if s.role == "leader" and s.service != service:
            first = firsts.setdefault((s.service, s.epoch), s)
            if s.complete < first.complete:
                firsts[(s.service, s.epoch)] = s
    for other in firsts.values():
        if any(s.role == "leader" and s.epoch >= other.epoch and s.invoke < other.complete for s in own):
            continue  # it led at that epoch or a newer one first: not deposed by this one
        again = next((i for i, s in enumerate(own) if s.role == "leader" and s.epoch > other.epoch), None)
        if again is None:
            until = float("inf")
        else:
            until = max(other.complete, own[again - 1].invoke) if again > 0 else other.complete
        out.append((other.complete, until, f"{other.service} (epoch {other.epoch})"))
    return out
