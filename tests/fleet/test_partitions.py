"""Partitions across hosts while clients stream puts and gets: after healing, the checker
(tests/fleet/checker.py) finds no violation and no acknowledged put lost. Each scenario runs
with two seeds (which daemon, how many puts before the fault)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from kvstore import errors
from kvstore.metaclient.client import MetaClient
from kvstore.wire.calls import Stats
from tests.cluster import Proc, found, wait_until
from tests.fleet.checker import Report, check
from tests.fleet.history import Op, read_history
from tests.fleet.roles import KVFleet, role_of

SEEDS = [1, 2]


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
    return [o for o in ops(path) if o.op == "put" and o.ok and o.complete is not None and o.complete > since]


def failed(path: Path, since: float) -> list[Op]:
    return [o for o in ops(path) if o.ok is False and o.invoke > since]


def stop(stream: Proc) -> None:
    assert stream.popen.stdin is not None
    stream.popen.stdin.write("stop\n")
    stream.popen.stdin.close()
    stream.popen.wait(60)
    assert any("driver done" in line for line in stream.lines), "".join(stream.lines)


def finish(fleet: KVFleet, tmp_path: Path, histories: list[Path]) -> Report:
    """Read every key back from the client host, check the whole history; nothing was evicted."""
    final = tmp_path / "final.jsonl"
    fleet.run_driver(fleet.clients[0], "verify", "--client", "verify", "--history", str(final),
                     "--read", *map(str, histories))  # fmt: skip
    with MetaClient(fleet.leader(), timeout_s=5) as meta:
        assert meta.call(Stats()).evictions == 0  # DRAM is sized so that no absence is an eviction
    report = check(read_history([*histories, final]), typed_errors())
    print(report.summary())
    return report


def first_ack_after(path: Path, t: float, leader: str | None = None) -> float:
    """Seconds from `t` to the first put acknowledged after it (by `leader`, if given)."""
    acks = [o.complete for o in acked_puts(path, t) if o.complete is not None and leader in (None, o.leader)]
    return min(acks) - t


@pytest.mark.parametrize("seed", SEEDS)
def test_a_daemon_partitioned_from_the_clients_loses_nothing(kvfleet: KVFleet, tmp_path: Path, seed: int):
    rng = random.Random(seed)
    net, client = kvfleet.net, kvfleet.clients[0]
    daemon = kvfleet.daemons[rng.randrange(len(kvfleet.daemons))][0]
    history = tmp_path / "c1.jsonl"
    stream = kvfleet.driver(client, "stream", "--history", str(history), "--seed", str(seed))
    before = rng.randint(30, 60)
    wait_until(lambda: len(acked_puts(history)) >= before, timeout=60, what="puts before the fault")
    faulted = time.monotonic()
    net.partition(daemon, client)  # the service still hears the daemon's heartbeats
    # Puts go on to the reachable daemon during the partition (the unreachable one is suspected).
    wait_until(lambda: len([o for o in ops(history) if o.invoke > faulted and o.complete]) >= 40
               and len(acked_puts(history, faulted)) >= 20, timeout=120, what="puts during the partition")  # fmt: skip
    healed = time.monotonic()
    net.heal(daemon, client)
    wait_until(lambda: len(acked_puts(history, healed)) >= 20, timeout=60, what="puts after healing")
    stop(stream)
    report = finish(kvfleet, tmp_path, [history])
    print(f"seed {seed}: {daemon.name} cut off from {client.name}; first acknowledged put "
          f"{first_ack_after(history, faulted):.2f} s after the fault; {len(failed(history, faulted))} "
          f"failed ops from then on")  # fmt: skip
    assert report.violations == [], report.summary()
    assert report.lost == 0 and report.acked_puts > before


@pytest.mark.parametrize("seed", SEEDS)
def test_the_leader_partitioned_from_redis_hands_over_and_loses_nothing(kvfleet: KVFleet, tmp_path: Path, seed: int):
    rng = random.Random(seed)
    net, client = kvfleet.net, kvfleet.clients[0]
    (leader, _, old), (_, _, standby) = kvfleet.metas
    history = tmp_path / "c1.jsonl"
    stream = kvfleet.driver(client, "stream", "--history", str(history), "--seed", str(seed))
    before = rng.randint(30, 60)
    wait_until(lambda: len(acked_puts(history)) >= before, timeout=60, what="puts before the fault")
    faulted = time.monotonic()
    net.partition(leader, kvfleet.host("redis"))  # clients and daemons still reach it
    wait_until(lambda: role_of(standby) == "leader", timeout=60, what="the standby to lead")
    led = time.monotonic()
    wait_until(lambda: len(acked_puts(history, led)) >= 20, timeout=60, what="puts under the new leader")
    healed = time.monotonic()
    net.heal(leader, kvfleet.host("redis"))
    wait_until(lambda: role_of(old) == "standby", timeout=60, what="the old leader to stand by")
    wait_until(lambda: len(acked_puts(history, healed)) >= 20, timeout=60, what="puts after healing")
    stop(stream)
    report = finish(kvfleet, tmp_path, [history])
    leaders = {o.leader for o in ops(history) if o.ok and o.complete is not None and o.complete > led}
    print(f"seed {seed}: standby led {led - faulted:.2f} s after the fault; its first acknowledged put "
          f"{first_ack_after(history, faulted, standby):.2f} s after the fault; answered by {leaders}")  # fmt: skip
    assert report.violations == [], report.summary()
    assert report.lost == 0 and report.acked_puts > before


def test_puts_go_on_to_the_reachable_daemon_while_one_is_cut_off(kvfleet: KVFleet, tmp_path: Path):
    """A batch whose keys the service spread over both daemons: the daemons are written at once
    and a connect gets connect_timeout_s, so the unreachable one holds up neither the other's
    writes (their grants would run out) nor the retry of its own keys on the other."""
    daemon, client = kvfleet.daemons[0][0], kvfleet.clients[0]
    kvfleet.net.partition(daemon, client)
    out = kvfleet.run_driver(client, "puts", "--history", str(tmp_path / "puts.jsonl"), "--count", "6")
    acked = int(found(r"acked (\d+) of 6", out).group(1))
    assert acked >= 4, f"{acked} of 6 put batches acknowledged while {daemon.name} was cut off from {client.name}"
