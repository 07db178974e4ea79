"""Helpers of the observability tests: a store with its admin and metrics ports on, and reading
Prometheus text the way a scraper does."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import Cluster, found, spawn


def serve_observed(
    dram: str, *extra: str, env: dict[str, str] | None = None, module: str = "kvstore.cli"
) -> tuple[Cluster, str, str, str]:
    """`kvstore serve` with --admin-port 0 and --metrics-port 0: (cluster, meta, admin, daemon metrics)."""
    cluster = Cluster()
    ssd = [] if "--ssd-dir" in extra else ["--ssd-dir", ""]
    try:
        proc = spawn(
            ["serve", "--port", "0", "--dram", dram, *ssd, "--admin-port", "0", "--metrics-port", "0", *extra],
            env,
            module=module,
        )
    except BaseException:
        cluster.close()
        raise
    cluster.procs.append(proc)
    meta = found(r"meta=(\S+)", proc.ready_line).group(1)
    admin = found(r"admin=(\S+)", proc.ready_line).group(1)
    metrics = found(r"metrics=(\S+)", proc.ready_line).group(1)
    return cluster, meta, admin, metrics


def fetch(url: str, data: bytes | None = None) -> bytes:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.read()


def scrape(address: str) -> str:
    return fetch(f"http://{address}/metrics").decode()


class Scrape:
    """One scrape's samples; value(name, **labels) is the one sample of `name` whose labels include
    `labels` (0.0 when there is none: a labelled counter never incremented is absent)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples = [s for family in text_string_to_metric_families(text) for s in family.samples]

    def value(self, name: str, **labels: str) -> float:
        found = [s for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples: {found}"
        return found[0].value if found else 0.0
