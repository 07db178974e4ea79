"""Metrics and the dashboard of a leader and a standby on one Redis: a standby has no store, so its
scrape has the call families only and its dashboard data says it is a standby; once it takes over,
its scrape reads the store it built from Redis."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from tests.cluster import wait_until
from tests.ha.conftest import FAST, meta_on
from tests.ha.test_ha import leader_of, writes_open
from tests.observability.scrape import Scrape, scrape


def keys_gauge(admin: str) -> float | None:
    """kvstore_meta_keys on `admin`'s /metrics, None when the scrape has no such family."""
    text = scrape(admin)
    return Scrape(text).value("kvstore_meta_keys") if "kvstore_meta_keys " in text else None


def test_a_standby_scrapes_without_store_figures_and_serves_them_after_taking_over(ha, redis):
    a, addr_a, admin_a = meta_on(ha, redis)
    wait_until(lambda: leader_of(addr_a), timeout=30, what="a leader")
    _, addr_b, admin_b = meta_on(ha, redis)
    ha.daemon(f"{addr_a},{addr_b}", "64MiB", FAST)
    wait_until(lambda: writes_open(addr_a), timeout=30, what="writes open")
    with KVClient(addr_a, ClientConfig(transports=("tcp",))) as client:
        client.put_many([f"k/{i}" for i in range(5)], [b"v" * 100] * 5)
    assert keys_gauge(admin_a) == 5.0
    standby = scrape(admin_b)
    assert keys_gauge(admin_b) is None and "kvstore_meta_calls_total" in standby
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{admin_b}/dashboard/data", timeout=10)
    assert refused.value.code == 503 and "standby" in json.loads(refused.value.read())["error"]

    a.kill()
    wait_until(lambda: leader_of(addr_b), timeout=30, what="the standby taking over")
    assert wait_until(lambda: keys_gauge(admin_b) == 5.0, timeout=30, what="the new leader's figures")
    with urllib.request.urlopen(f"http://{admin_b}/dashboard/data", timeout=10) as resp:
        assert json.loads(resp.read())["store"]["keys"] == 5
