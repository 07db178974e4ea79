"""The link monitor sees a shaped link: a daemon host's link throttled with tc tbf to 200 Mbit/s,
a client on another host writes and reads a few MiB over tcp (no shm across hosts), and
KVClient.links() reports that link's bandwidth within 20 % of the rate; restored, it is faster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.fleet.netns import Fleet
from tests.fleet import roles

RATE_MBIT = 200


def measured(fleet: roles.KVFleet, seed: int) -> dict[str, Any]:
    out = fleet.run_driver(fleet.clients[0], "links", "--seed", str(seed), "--count", "8", "--mib", "1")
    line = next(line for line in out.splitlines() if line.startswith("links: "))
    (link,) = json.loads(line.removeprefix("links: "))  # one daemon: one link
    return dict(link)


def test_the_client_measures_a_tbf_shaped_link_within_20_percent(net: Fleet, tmp_path: Path):
    fleet = roles.start(net, tmp_path, daemons=1)
    daemon = fleet.daemons[0][0]
    net.shape(daemon, RATE_MBIT)
    shaped = measured(fleet, 1)
    rate = RATE_MBIT * 1e6 / 8
    print(f"tbf {RATE_MBIT} Mbit/s: measured {shaped['bandwidth_bytes_per_s'] * 8 / 1e6:.0f} Mbit/s over "
          f"{shaped['transport']} ({shaped['transfers']} transfers, {shaped['bytes'] >> 20} MiB)")  # fmt: skip
    assert shaped["transport"] == "tcp"  # another host: no shm
    assert abs(shaped["bandwidth_bytes_per_s"] - rate) <= 0.2 * rate, shaped
    net.restore(daemon)
    free = measured(fleet, 2)
    print(f"restored: measured {free['bandwidth_bytes_per_s'] * 8 / 1e6:.0f} Mbit/s")
    assert free["bandwidth_bytes_per_s"] > 1.5 * rate, free
