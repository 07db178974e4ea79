"""The faults of tests/fleet/test_faults.py and benchmarks/fleet/scenarios.py: each a Scenario
(tests/fleet/scenarios.py) whose fault step makes the fault and waits until it bites, and returns
the step that heals it. A scenario that shows a bug still open names it (Scenario.bug; the bugs they
found, all fixed now, are in docs/fleet.md)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from benchmarks.fleet.netns import Host
from kvstore.metaclient.rediskeys import Keys
from tests.cluster import wait_until
from tests.fleet.rediscluster import repl_offset
from tests.fleet.roles import role_of
from tests.fleet.scenarios import WAIT_S, Run, Scenario, ops

FLAPS = 8  # down/up cycles of a flapping link before it is healed


def _daemon_from_clients(run: Run) -> Callable[[], None]:
    daemon = run.daemon()
    run.net.partition(daemon, run.client)  # the service still hears its heartbeats
    run.made()
    run.notes.append(f"{daemon.name} cut off from {run.client.name}")
    return lambda: run.net.heal(daemon, run.client)


def _daemon_from_service(run: Run) -> Callable[[], None]:
    daemon = run.daemon()
    for meta, _, _ in run.fleet.metas:
        run.net.partition(daemon, meta)  # clients still reach it
    run.made()
    n = len(run.fleet.daemons)
    wait_until(lambda: 0 <= run.daemons_seen() < n, timeout=WAIT_S, what=f"the service to set {daemon.name} aside")
    run.notes.append(f"{daemon.name} cut off from the service until set aside")

    def heal() -> None:
        for meta, _, _ in run.fleet.metas:
            run.net.heal(daemon, meta)

    return heal


def _leader_from(peers: Callable[[Run], list[Host]], both: bool = True) -> Callable[[Run], Callable[[], None]]:
    def fault(run: Run) -> Callable[[], None]:
        leader, _, address = run.leading()
        cut = peers(run)
        for peer in cut:
            run.net.partition(leader, peer, both)
        run.made()
        run.notes.append(f"{leader.name} {'<-/->' if both else '-/->'} {','.join(p.name for p in cut)}")
        if any(p.name == "redis" for p in cut):
            run.standby_leads(address)

        def heal() -> None:
            for peer in cut:
                run.net.heal(leader, peer, both)

        return heal

    return fault


def _redis(run: Run) -> list[Host]:
    return [run.fleet.host("redis")]


def _daemons(run: Run) -> list[Host]:
    return [h for h, _ in run.fleet.daemons]


def _clients(run: Run) -> list[Host]:
    return list(run.fleet.clients)


def _leader_from_daemons(run: Run) -> Callable[[], None]:
    heal = _leader_from(_daemons)(run)
    wait_until(lambda: run.daemons_seen() == 0, timeout=WAIT_S, what="the leader to set its daemons aside")
    return heal


def _pause_leader(run: Run) -> Callable[[], None]:
    host, proc, address = run.leading()
    assert run.stream.popen.stdin is not None
    run.stream.popen.stdin.write("arm\n")
    run.stream.popen.stdin.flush()
    wait_until(lambda: any("driver paused" in line for line in run.stream.lines), timeout=WAIT_S,
               what="the driver to pause the leader")  # fmt: skip
    run.made()
    run.notes.append(next(line.strip() for line in run.stream.lines if "driver paused" in line))
    run.standby_leads(address)

    def resume() -> None:
        proc.popen.send_signal(signal.SIGCONT)
        wait_until(lambda: role_of(address) == "standby", timeout=WAIT_S, what=f"{host.name} to stand by")

    return resume


def _flapping(run: Run) -> Callable[[], None]:
    daemon, client = run.daemon(), run.client
    period = run.rng.uniform(0.2, 0.5)
    done = threading.Event()
    flaps = [0]

    def flap() -> None:
        while not done.wait(period):
            if run.net.partitioned(daemon, client):
                run.net.heal(daemon, client)
            else:
                run.net.partition(daemon, client)
                flaps[0] += 1

    thread = threading.Thread(target=flap, daemon=True)
    thread.start()
    run.made()
    wait_until(lambda: flaps[0] >= FLAPS, timeout=WAIT_S, what=f"{FLAPS} flaps")

    def heal() -> None:
        done.set()
        thread.join(10)
        run.net.heal(daemon, client)
        run.notes.append(f"{daemon.name}-{client.name} down/up every {period * 1000:.0f} ms, {flaps[0]} times")

    return heal


def _everything(run: Run) -> Callable[[], None]:
    """The leader from Redis (the standby takes over), one daemon from the client, the other from
    the old leader: then every partition healed at once."""
    leader, _, address = run.leading()
    d1 = run.daemon()
    d2 = next(h for h, _ in run.fleet.daemons if h != d1)
    run.net.partition(leader, run.fleet.host("redis"))
    run.net.partition(d1, run.client)
    run.net.partition(d2, leader)
    run.made()
    run.standby_leads(address)
    run.notes.append(f"{leader.name}<-/->redis, {d1.name}<-/->{run.client.name}, {d2.name}<-/->{leader.name}")
    return run.net.heal_all


def _redis_master(unreplicated: bool) -> Callable[[Run], Callable[[], None]]:
    """Kill (SIGKILL) the Redis Cluster master of the store's records while puts stream; its
    replica is promoted by the cluster. With `unreplicated`, the master is first cut off from its
    replica until a put fails: the writes it takes then are never WAITed for (durability
    replicas:1) and are lost with it. Healed by starting the node again on its files: it rejoins
    as the promoted node's replica, and until then no write rests on two copies (none acknowledged)."""

    def fault(run: Run) -> Callable[[], None]:
        cluster = run.fleet.redis_cluster
        assert cluster is not None
        master = cluster.master_of(Keys("default").obj)
        replica = cluster.replica_of(master)
        if unreplicated:
            run.net.partition(master.host, replica.host)
            cut = time.monotonic()
            wait_until(lambda: any(o.op == "put" and o.ok is False and o.invoke > cut for o in ops(run.history)),
                       timeout=WAIT_S, what="a put refused, its write not on the replica")  # fmt: skip
            ahead = repl_offset(master) - repl_offset(replica)
            assert ahead > 0, "the master took no write its replica lacks: nothing un-WAITed to lose"
            run.notes.append(f"master {ahead} bytes of writes ahead of its replica")
        cluster.kill(master)
        run.made()
        others = [n for n in cluster.nodes if n is not master]
        wait_until(lambda: replica.role() == "master" and all(n.cluster_ok() for n in others), timeout=WAIT_S,
                   what=f"{replica.host.name} promoted")  # fmt: skip
        how = ", cut off from its replica first," if unreplicated else ""
        run.notes.append(f"{master.host.name} (master of the records){how} killed, {replica.host.name} promoted")

        def heal() -> None:
            if unreplicated:
                run.net.heal(master.host, replica.host)
            cluster.start(master)
            wait_until(lambda: master.role() == "slave" and master.cluster_ok(), timeout=WAIT_S,
                       what=f"{master.host.name} back as a replica")  # fmt: skip

        return heal

    return fault


ALL = [
    Scenario("daemon-from-clients", _daemon_from_clients, puts_during=True),
    Scenario("daemon-from-service", _daemon_from_service, puts_during=True),
    Scenario("leader-from-redis", _leader_from(_redis), puts_during=True),
    Scenario("leader-to-redis-one-way", _leader_from(_redis, both=False), puts_during=True),
    Scenario("leader-from-daemons", _leader_from_daemons, puts_during=False),
    # A shorter timeout_s: the calls that outlast their deadline come back sooner.
    Scenario("leader-from-clients", _leader_from(_clients), puts_during=False, timeout_s=2.0),
    Scenario("pause-leader-in-get", _pause_leader, puts_during=True, pause_in="Get"),
    Scenario("pause-leader-in-putend", _pause_leader, puts_during=True, pause_in="PutEnd"),
    Scenario("flapping-client-daemon", _flapping, puts_during=True),
    Scenario("partitions-then-heal-all", _everything, puts_during=True),
    Scenario("redis-cluster-master-killed", _redis_master(False), puts_during=False, redis_cluster=True),
    Scenario("redis-cluster-unwaited-write-lost", _redis_master(True), puts_during=False, redis_cluster=True),
]
BY_NAME = {s.name: s for s in ALL}
