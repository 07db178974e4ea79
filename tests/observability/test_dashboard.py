"""The dashboard page in a real headless browser (Debian's chromium driven by Playwright), over a
real store, two reference engines and a router registered with the dashboard: after a known
workload its numbers are those of `kvstore stat`, the router's TTFT/TPOT and fallback rate show,
evictions are listed; a screenshot is kept in build/test-artifacts/. And `kvstore top --once`
prints the same figures in the terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.launch import Fleet
from tests.cluster import SECRET, wait_until

pytestmark = pytest.mark.slow
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(
    os.environ.get("KVSTORE_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "build" / "test-artifacts")
)
MIB = 1 << 20


def kvstore(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "kvstore.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, KVSTORE_SECRET=SECRET),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def store():
    """A store (16 MiB of DRAM, no SSD), engines and a router; the workload: 3 requests through the
    router (PD), then 24 blocks of 1 MiB put (evicting) and read by a client, and a prefix lookup."""
    os.environ.setdefault("KVSTORE_SECRET", SECRET)
    with Fleet() as fleet:
        proc, meta = fleet.store("16MiB", "--ssd-dir", "", "--admin-port", "0", "--metrics-port", "0")
        admin = proc.field("admin")
        kv = ("--kv-transports", "tcp")
        _, prefill = fleet.engine("prefill", meta, *kv)
        _, decode = fleet.engine("decode", meta, *kv)
        _, router = fleet.router([prefill], [decode], [], meta, "--policy", "pd", "--dashboard", admin)
        for i in range(3):
            body = {"prompt": [(7 * i + j) % 256 for j in range(300)], "max_tokens": 4}
            httpx.post(f"{router}/v1/completions", json=body, timeout=120).raise_for_status()
        with KVClient(meta, ClientConfig(transports=("tcp",))) as client:
            keys = [f"dash/{i}" for i in range(24)]
            for key in keys:
                client.put(key, key.encode().ljust(MIB, b"."))
            client.get_many_into(keys, [bytearray(MIB) for _ in keys], strict=False)
            client.match_prefix(keys[-4:])
        stat = json.loads(kvstore("stat", "--meta", meta, "--json"))
        yield admin, router, stat


def _page_numbers(page) -> dict[str, Any]:
    def text(selector: str) -> str:
        return page.inner_text(selector).strip()

    out = {
        "keys": int(text('#store [data-field="keys"]')),
        "evictions": int(text('#store [data-field="evictions"]')),
        "tiers": {},
        "daemons": page.locator("#daemons tbody tr[data-daemon]").count(),
    }
    for row in page.locator("#tiers tbody tr[data-tier]").all():
        tier = row.get_attribute("data-tier")
        out["tiers"][tier] = {
            f: int(row.locator(f'[data-field="{f}"]').inner_text())
            for f in ("blocks", "hits", "evictions", "demotions", "promotions")
        }
    return out


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (scripts/setup.sh)")
def test_the_dashboard_shows_what_kvstore_stat_says(store):
    from playwright.sync_api import sync_playwright

    admin, _router, stat = store
    wait_until(
        lambda: httpx.get(f"http://{admin}/dashboard/data").json()["routers"][0].get("requests") == 3,
        what="the router's figures on the dashboard",
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://{admin}/dashboard")
            page.wait_for_selector("body[data-updated]")
            page.wait_for_selector('#routers tbody tr[data-router] [data-field="requests"]:text("3")')
            page.wait_for_selector("#events li.kind-eviction")
            shown = _page_numbers(page)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            router_row = page.locator("#routers tbody tr[data-router]")
            ttft_p50 = router_row.locator('[data-field="ttft_p50"]').inner_text()
            fallback = router_row.locator('[data-field="fallback_rate"]').inner_text()
            status = page.inner_text("#status")
        finally:
            browser.close()
    assert shown["keys"] == stat["keys"]
    assert shown["evictions"] == stat["evictions"] > 0
    assert shown["daemons"] == len(stat["daemons"]) == 1
    assert shown["tiers"] == {
        t["tier"]: {f: t[f] for f in ("blocks", "hits", "evictions", "demotions", "promotions")} for t in stat["tiers"]
    }
    assert ttft_p50.endswith(" ms") and float(ttft_p50.split()[0]) > 0
    assert fallback == "0.0%"
    assert status.startswith("updated")
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


def test_kvstore_top_prints_the_same_figures(store):
    admin, _, stat = store
    frame = kvstore("top", "--admin", admin, "--once")
    assert f"keys {stat['keys']} " in frame
    assert f"evictions {stat['evictions']} " in frame
    (dram,) = [t for t in stat["tiers"] if t["tier"] == "dram"]
    row = next(line for line in frame.splitlines() if line.strip().strip("│┃ ").startswith("dram"))
    cells = [c.strip() for c in row.replace("┃", "│").split("│") if c.strip()]
    assert cells[4:6] == [str(dram["blocks"]), str(dram["hits"])]
    assert "routers" in frame and "eviction" in frame
