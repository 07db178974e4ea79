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

Imports nothing from kvstore: the caller passes the typed error names and the evicted keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from enum import Enum

from tests.fleet.history import Op


class Kind(Enum):
    LOST = "an acknowledged put is not readable with its bytes at the end"
    UNWRITTEN_READ = "a read returned bytes no put of that key wrote"
    RESURRECTED = "a removed key came back"
    UNTYPED = "an error that is not a typed store error"
    LATE = "an operation returned after its deadline"
    HUNG = "an operation never returned"


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

    def summary(self) -> str:
        head = f"{self.ops} ops, {self.acked_puts} acknowledged puts, {len(self.violations)} violations"
        return "\n".join([head, *(f"  {v}" for v in self.violations[:50])])


def check(
    ops: Iterable[Op], typed_errors: Collection[str], evicted: Collection[str] = (), slack_s: float = 1.0
) -> Report:
    """Check a history (every client's operations, final read-back included) against 1-4 above."""
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
