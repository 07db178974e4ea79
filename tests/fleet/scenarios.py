"""Fault scenarios on a fleet (roles.start): a client on c1 streams puts, gets and removes; one
fault is made once a seeded number of puts is acknowledged and held until it bites; then it is
healed, the fleet settles (one leader, the other standing by, writes open, every daemon mounted)
and puts go on; every key is read back and the checker (tests/fleet/checker.py) judges the
history, with the leadership sightings of a LeaderWatch. `play` returns the measures that
tests/fleet/test_faults.py asserts and benchmarks/fleet/scenarios.py reports; the faults
themselves are in tests/fleet/faults.py.

The seed picks the daemon (where there is a choice), the number of puts before the fault, the
flapping period, and how long after sending the call a pause lands (below).

Pausing the leader inside a call: the stream's driver wraps its client's metadata calls
(driver.Tap); once armed (a line `arm` on its stdin), the next call of the named kind (Get, or
PutEnd) starts a timer of 0-3 ms (seeded) and is sent; the timer SIGSTOPs the leader's process.
So the service stops with that call in flight: not yet read, being handled, or its Redis write
under way, by the seed. It is resumed (SIGCONT) once the standby leads.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fleet.netns import Fleet, Host
from kvstore import errors
from kvstore.metaclient.client import MetaClient
from kvstore.results import StoreStats
from kvstore.wire.calls import Stats
from tests.cluster import ADMIN_TOKEN, Proc, wait_until
from tests.fleet import roles
from tests.fleet.checker import Report, check
from tests.fleet.history import Op, read_history, read_sightings
from tests.fleet.roles import KVFleet, role_of
from tests.fleet.watch import LeaderWatch

GRANT_S = 2.0  # the longest grant lifetime under roles.ENV (read lease, write grant)
AFTER = 10  # acknowledged puts awaited during a fault that leaves puts possible, and after healing
WAIT_S = 90.0


def typed_errors() -> set[str]:
    """The names of every kvstore error class: what a client may see."""
    found, todo = set(), [errors.KVStoreError]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo += cls.__subclasses__()
    return found


def ops(path: Path) -> list[Op]:
    return read_history([path]) if path.exists() else []


def acked_puts(path: Path, since: float = 0.0) -> list[Op]:
    """Acknowledged puts invoked after `since`."""
    return [o for o in ops(path) if o.op == "put" and o.ok and o.invoke > since]


def stop(stream: Proc) -> None:
    assert stream.popen.stdin is not None
    stream.popen.stdin.write("stop\n")
    stream.popen.stdin.close()
    stream.popen.wait(60)
    assert any("driver done" in line for line in stream.lines), "".join(stream.lines)


def stats(address: str) -> StoreStats | None:
    try:
        with MetaClient(address, timeout_s=2, token=ADMIN_TOKEN) as meta:
            return meta.call(Stats())
    except errors.KVStoreError:
        return None


@dataclass
class Run:
    """One scenario being played: what its fault and heal steps act on."""

    fleet: KVFleet
    rng: random.Random
    history: Path
    stream: Proc
    notes: list[str] = field(default_factory=list)
    faulted: float = 0.0  # when the fault was in place

    def made(self) -> None:
        """The fault is in place now (what fault-to-first-put counts from)."""
        self.faulted = time.monotonic()

    @property
    def net(self) -> Fleet:
        return self.fleet.net

    @property
    def client(self) -> Host:
        return self.fleet.clients[0]

    def leading(self) -> tuple[Host, Proc, str]:
        """The meta that leads now."""
        address = self.fleet.leader()
        return next(m for m in self.fleet.metas if m[2] == address)

    def daemon(self) -> Host:
        return self.fleet.daemons[self.rng.randrange(len(self.fleet.daemons))][0]

    def standby_leads(self, old: str) -> None:
        others = [a for _, _, a in self.fleet.metas if a != old]
        wait_until(lambda: any(role_of(a) == "leader" for a in others), timeout=WAIT_S, what="the standby to lead")

    def daemons_seen(self) -> int:
        s = stats(self.fleet.leader())
        return len(s.daemons) if s is not None else -1


@dataclass(frozen=True)
class Scenario:
    name: str
    # Makes the fault and waits until it bites; returns the step that heals it.
    fault: Callable[[Run], Callable[[], None]]
    puts_during: bool  # acknowledged puts go on during the fault (else: clients see errors only)
    pause_in: str = ""  # the stream's driver pauses the leader in this call (see the module doc)
    bug: str = ""  # a known bug this scenario shows (its test is a strict xfail)
    timeout_s: float = 5.0  # the streaming client's timeout_s (its operations' deadline: 4 x that)
    redis_cluster: bool = False  # the records on a Redis Cluster (r1..r6), durability replicas:1


@dataclass(frozen=True)
class Measures:
    scenario: str
    seed: int
    startup_s: float
    fault_to_put_s: float  # fault -> the first acknowledged put invoked after it
    heal_to_service_s: float  # heal -> settled, and the last error (but KeyNotFound) seen after it
    evictions: int
    report: Report
    notes: tuple[str, ...]

    def line(self) -> str:
        r = self.report
        return (f"{self.scenario} seed {self.seed}: up {self.startup_s:.1f} s, fault->put {self.fault_to_put_s:.2f} s, "
                f"heal->service {self.heal_to_service_s:.2f} s, {r.acked_puts} acked, lost {r.lost}, "
                f"violations {len(r.violations)}, stale reads {r.stale_reads}; {'; '.join(self.notes)}")  # fmt: skip


def play(scenario: Scenario, net: Fleet, tmp: Path, seed: int) -> Measures:
    fleet = roles.start(net, tmp, redis_cluster=scenario.redis_cluster)
    rng = random.Random(f"{scenario.name}/{seed}")
    history, sightings = tmp / "c1.jsonl", tmp / "roles.jsonl"
    extra: list[str] = []
    if scenario.pause_in:
        after_ms = rng.uniform(0, 3)
        pid = str(fleet.metas[0][1].pid)
        extra = ["--pause-pid", pid, "--pause-in", scenario.pause_in, "--pause-ms", f"{after_ms:.2f}"]
    with LeaderWatch([a for _, _, a in fleet.metas], sightings):
        stream = fleet.driver(fleet.clients[0], "stream", "--history", str(history), "--seed", str(seed),
                              "--timeout", str(scenario.timeout_s), *extra)  # fmt: skip
        run = Run(fleet, rng, history, stream)
        before = rng.randint(15, 30)
        wait_until(lambda: len(acked_puts(history)) >= before, timeout=WAIT_S, what="puts before the fault")
        heal = scenario.fault(run)
        faulted = run.faulted
        if scenario.puts_during:
            wait_until(lambda: len(acked_puts(history, faulted)) >= AFTER, timeout=WAIT_S, what="puts during the fault")
        else:  # a put and a get answered (with an error) during the fault
            wait_until(lambda: {o.op for o in ops(history) if o.invoke > faulted and o.complete} >= {"put", "get"},
                       timeout=2 * WAIT_S, what="a put and a get during the fault")  # fmt: skip
        healed = time.monotonic()
        heal()
        settled = settle(fleet)
        wait_until(lambda: len(acked_puts(history, settled)) >= AFTER, timeout=WAIT_S, what="puts after healing")
        stop(stream)
    report, evictions = finish(fleet, tmp, [history], sightings)
    after = ops(history)
    first_put = min((o.complete for o in acked_puts(history, faulted) if o.complete), default=float("nan"))
    errors_after = [o.complete for o in after if o.invoke > healed and o.ok is False and o.error != "KeyNotFound"]
    service = max([settled, *[t for t in errors_after if t is not None]])
    return Measures(scenario.name, seed, fleet.startup_s, first_put - faulted, service - healed, evictions, report,
                    tuple(run.notes))  # fmt: skip


def settle(fleet: KVFleet) -> float:
    """Wait until one meta leads with writes open and every daemon mounted, the other stands by."""

    def settled() -> bool:
        r = [role_of(a) for _, _, a in fleet.metas]
        if sorted(r) != ["leader", "standby"]:
            return False
        s = stats(fleet.metas[r.index("leader")][2])
        return s is not None and s.writes_open and s.reconciling == 0 and len(s.daemons) == len(fleet.daemons)

    wait_until(settled, timeout=WAIT_S, what="the fleet to settle")
    return time.monotonic()


def finish(fleet: KVFleet, tmp: Path, histories: list[Path], sightings: Path) -> tuple[Report, int]:
    """Read every key back from the client host and check the whole history; and the evictions
    the service counted (DRAM is sized so that there are none: no absence is an eviction)."""
    final = tmp / "final.jsonl"
    fleet.run_driver(fleet.clients[0], "verify", "--client", "verify", "--history", str(final),
                     "--read", *map(str, histories))  # fmt: skip
    s = stats(fleet.leader())
    report = check(read_history([*histories, final]), typed_errors(), sightings=read_sightings([sightings]),
                   grant_s=GRANT_S)  # fmt: skip
    return report, s.evictions if s is not None else -1
