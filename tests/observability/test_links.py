"""The link monitor against a real daemon slowed on purpose (tests/observability/throttled.py): the measured
bandwidth drops, the router's cost model moves long prompts off PD, and the example alert rule
fires when promtool evaluates it on the scraped metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.router.policy import CostModel, CostPolicy, InstanceLoad, Pools, Route, RouteRequest
from kvstore.engines.router.telemetry import Telemetry
from tests.observability import throttled
from tests.observability.scrape import Scrape, serve_observed

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "docs" / "prometheus" / "alerts.yml"
THROTTLE = 5e6  # bytes/s


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Link figures and client scrapes before and after one daemon is throttled."""
    rate_file = tmp_path_factory.mktemp("throttle") / "bytes_per_s"
    env = {throttled.RATE_FILE_ENV: str(rate_file), "PYTHONPATH": str(REPO)}
    cluster, meta, _, _ = serve_observed("64MiB", env=env, module="tests.observability.throttled")
    try:
        with KVClient(meta, ClientConfig(transports=("tcp",))) as kv:
            keys = [f"link/{i}" for i in range(12)]
            kv.put_many(keys, [bytes([i]) * MIB for i in range(12)])
            for key in keys[:6]:  # one 1 MiB read per call: six samples
                kv.get(key)
            before = kv.links()
            assert kv.metrics is not None  # metrics are on by default
            text_before = generate_latest(kv.metrics.registry).decode()
            throttled.set_rate(rate_file, THROTTLE)
            for key in keys[6:9]:
                kv.get(key)
            after = kv.links()
            text_after = generate_latest(kv.metrics.registry).decode()
            throttled.set_rate(rate_file, 0)
        yield before, after, text_before, text_after
    finally:
        cluster.close()


def test_measured_bandwidth_drops_when_the_daemon_is_throttled(measured):
    before, after, _, _ = measured
    (b,), (a,) = before, after
    assert b.transport == a.transport == "tcp" and b.daemon == a.daemon
    assert b.bandwidth_bytes_per_s > 20 * THROTTLE  # loopback tcp: hundreds of MB/s at least
    assert a.bandwidth_bytes_per_s < 2 * THROTTLE  # the next transfers show the throttle
    assert a.transfers == b.transfers + 3 and a.bytes == b.bytes + 3 * MIB


def test_the_router_shifts_long_prompts_away_from_pd(measured):
    """The cost model with the live link figures: a long prompt whose local instance is busy goes PD
    over the fast link and stays colocated once the link is slow; a short one stays colocated."""
    before, after, _, _ = measured
    now = [0.0]
    model = CostModel(kv_bytes_per_token=64 << 10, default_bandwidth=1e12)  # the default would favour PD
    telemetry = Telemetry(model, clock=lambda: now[0])
    policy = CostPolicy(model, telemetry)
    pools = Pools(prefill=("p",), decode=("d",), colocated=("c",))
    loads = {"c": InstanceLoad(requests=8, tokens=4000)}
    long, short = RouteRequest(4000), RouteRequest(300)

    telemetry.record_links([link.to_dict() for link in before])
    assert telemetry.bandwidth() == pytest.approx(before[0].bandwidth_bytes_per_s)
    assert policy.decide(long, pools, loads).route is Route.PD
    assert policy.decide(short, pools, loads).route is Route.COLOCATED

    now[0] += 1.0
    telemetry.record_links([link.to_dict() for link in after])
    slow = policy.decide(long, pools, loads)
    assert slow.route is Route.COLOCATED and "colocated" in slow.reason
    assert slow.transfer_s is not None and slow.saved_s is not None and slow.transfer_s > slow.saved_s
    assert policy.decide(short, pools, loads).route is Route.COLOCATED


def _promtool_test(tmp_path: Path, scraped: str, expect_alert: bool) -> subprocess.CompletedProcess[str]:
    """promtool's rule unit test: the scraped link gauge as a constant series for 5 minutes, and
    whether KVStoreLinkSlow fires at 3m (it has `for: 1m`)."""
    samples = Scrape(scraped).samples
    (link,) = [s for s in samples if s.name == "kvstore_client_link_bandwidth_bytes_per_second"]
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(link.labels.items()))
    alerts = [{"exp_labels": {**link.labels, "severity": "warning"}}] if expect_alert else []
    for alert in alerts:
        alert["exp_annotations"] = {
            "summary": f"KV link {link.labels['host']} -> {link.labels['daemon']} (tcp) below 100 MB/s",
            "description": "TTFT of PD requests rises while prefill time looks normal; the router shifts long "
            "prompts to colocated.",
        }
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f"kvstore_client_link_bandwidth_bytes_per_second{{{labels}}}",
                        "values": f"{link.value}x5",
                    }
                ],
                "alert_rule_test": [{"eval_time": "3m", "alertname": "KVStoreLinkSlow", "exp_alerts": alerts}],
            }
        ],
    }
    path = tmp_path / f"link-{expect_alert}.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    return subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_the_slow_link_alert_fires_on_the_scraped_metrics(measured, tmp_path):
    _, _, text_before, text_after = measured
    quiet = _promtool_test(tmp_path, text_before, expect_alert=False)
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    fired = _promtool_test(tmp_path, text_after, expect_alert=True)
    assert fired.returncode == 0, fired.stdout + fired.stderr
    # and the other way round fails: the expectation is really checked
    assert _promtool_test(tmp_path, text_before, expect_alert=True).returncode != 0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_the_example_rules_are_valid():
    checked = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_active_probe_measures_latency_without_traffic():
    """With link_probe_s, an empty tcp request to each daemon the client has used times the link
    while no transfer runs: the link's latency is refreshed, its transfer count stays."""
    from kvstore.metrics.client import tcp_probe_targets
    from kvstore.metrics.links import LinkProbe

    cluster, meta, _, _ = serve_observed("64MiB")
    try:
        with KVClient(meta, ClientConfig(transports=("tcp",))) as kv:
            kv.put("probe/k", bytes(MIB))  # a bandwidth sample, no latency one
            (link,) = kv.links()
            assert link.latency_s is None and link.transfers == 1
            assert kv.metrics is not None  # metrics are on by default
            probe = LinkProbe(
                kv.metrics.links, tcp_probe_targets(kv.metrics, lambda: kv.transport("tcp"), 5.0), interval_s=3600
            )
            probe.probe_once()  # what the probe's thread does each period
            (probed,) = kv.links()
            assert probed.latency_s is not None and 0 < probed.latency_s < 1.0
            assert probed.transfers == 1 and probed.failures == 0
        with KVClient(meta, ClientConfig(transports=("tcp",), link_probe_s=0.05)) as kv:
            kv.get("probe/k")
            from tests.cluster import wait_until

            wait_until(lambda: kv.links()[0].latency_s is not None, what="a probed latency")
    finally:
        cluster.close()
