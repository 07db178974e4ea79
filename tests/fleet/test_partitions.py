"""Puts while a daemon is cut off from the client: they go on to the reachable daemon. (The
partition scenarios with a stream of puts and gets and the checker are in test_faults.py.)"""

from __future__ import annotations

from pathlib import Path

from tests.cluster import found
from tests.fleet.roles import KVFleet


def test_puts_go_on_to_the_reachable_daemon_while_one_is_cut_off(kvfleet: KVFleet, tmp_path: Path):
    """A batch whose keys the service spread over both daemons: the daemons are written at once
    and a connect gets connect_timeout_s, so the unreachable one holds up neither the other's
    writes (their grants would run out) nor the retry of its own keys on the other."""
    daemon, client = kvfleet.daemons[0][0], kvfleet.clients[0]
    kvfleet.net.partition(daemon, client)
    out = kvfleet.run_driver(client, "puts", "--history", str(tmp_path / "puts.jsonl"), "--count", "6")
    acked = int(found(r"acked (\d+) of 6", out).group(1))
    assert acked >= 4, f"{acked} of 6 put batches acknowledged while {daemon.name} was cut off from {client.name}"
