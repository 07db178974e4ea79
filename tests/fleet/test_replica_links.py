"""Replica choice follows the measured links, across namespace hosts: a key with two replicas, one
on a daemon behind an 800 Mbit/s tbf link and one on an unshaped daemon, is read from the unshaped
one, because the client's link monitor measured both links when it wrote them. (Before, the reads
followed the service's order and could come from the shaped replica at ~0.1 GB/s.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.fleet.netns import Fleet
from tests.fleet import roles

RATE_MBIT = 800


def test_a_two_replica_key_is_read_over_the_faster_link(net: Fleet, tmp_path: Path):
    fleet = roles.start(net, tmp_path, daemons=2)
    (slow, _), (fast, _) = fleet.daemons
    net.shape(slow, RATE_MBIT)
    argv = [sys.executable, "-m", "tests.fleet.replica_reader", "--meta", fleet.meta_list, "--fast", fast.address]
    out = subprocess.run(net.command(fleet.clients[0], argv), capture_output=True, text=True, timeout=120,
                         cwd=roles.REPO, env={**os.environ, **roles.ENV})  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("replicas: "))
    report = json.loads(line.removeprefix("replicas: "))
    print(f"two-replica read {sorted(r / 1e9 for r in report['two_replica_rates'])} GB/s, the faster link alone "
          f"{sorted(r / 1e9 for r in report['fast_link_rates'])} GB/s: ratio {report['ratio']:.2f}; "
          f"bandwidth measured {report['bandwidth']}")  # fmt: skip
    gets = report["get_bytes"]
    assert gets.get(fast.address, 0) > 0, report
    assert gets.get(slow.address, 0) == 0, f"read from the replica behind the {RATE_MBIT} Mbit/s link: {report}"
