"""`kvstore bench --quick` end to end: it starts its own meta and daemon, measures, and reports.

Only the shape of the report is checked; the numbers depend on the machine and are never asserted.
"""

import json
import re
import subprocess
import sys

import pytest


def test_quick_bench_prints_ceilings_and_target_ratios(tmp_path):
    out_json = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "kvstore.cli", "bench", "--quick", "--meta-blocks", "20000",
                           "--json", str(out_json)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout

    ceilings = out.split("== ceilings (this run) ==")[1].split("==")[0]
    for name in (r"memcpy\s+256 MiB", r"memcpy\s+16 MiB", r"tcp socket\s+1 MiB", r"tcp socket\s+16 MiB"):
        assert re.search(name + r"\s+\d+\.\d+", ceilings), f"no {name} ceiling in:\n{out}"

    targets = out.split("== targets ==")[1]
    for name in ("shm get 1 MiB single", "shm get 1 MiB batched", "tcp get 1 MiB single", "tcp get 1 MiB batched",
                 "match_prefix 1000 keys", "metadata at"):
        line = next((ln for ln in targets.splitlines() if ln.startswith(name)), None)
        assert line is not None, f"no target line for {name!r} in:\n{out}"
        assert re.search(r"\d+\.\d\d\s+(met|NOT MET)$", line), line

    doc = json.loads(out_json.read_text())
    assert {t["path"] for t in doc["results"]["throughput"]} == {"shm", "tcp"}
    assert doc["results"]["meta_memory"][0]["blocks"] == 20000
    assert all(isinstance(t["met"], bool) and t["ratio"] > 0 for t in doc["targets"])
    assert not doc["results"]["skipped"], doc["results"]["skipped"]


def test_quick_bench_compares_with_mooncake_store(tmp_path):
    pytest.importorskip("mooncake.store", reason="Mooncake Store is not installed (pip install 'kvstore[mooncake]')")
    out_json = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "kvstore.cli", "bench", "--quick", "--compare", "mooncake",
                           "--meta-blocks", "20000", "--json", str(out_json)],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout

    section = out.split("== kvstore vs Mooncake Store")[1].split("\n== ")[0]
    assert re.search(r"^mooncake: measured in \d+ s$", section, re.M), f"Mooncake Store did not run:\n{out}"
    rate = r"[\d.]+(?: [kM])?"
    for row in (r"get\s+1 MiB\s+single\s+GB/s", r"put\s+1 MiB\s+batched x32\s+GB/s", r"get\s+4 KiB\s+single\s+ops/s",
                r"exists p50\s+4 KiB\s+single\s+us"):
        # the Mooncake value, then a value and a ratio for shm and for tcp at least
        assert re.search(rf"^{row}\s+{rate}(\s+{rate}\s+\d+\.\d\d){{2,}}$", section, re.M), \
            f"no {row} row in:\n{section}"
    assert re.search(rf"^\d+(?: vs \d+)? keys/call\s+{rate}\s+{rate}\s+\d+\.\d\d$", section, re.M), section
    assert re.search(r"^ceilings \(this run\): memcpy 256 MiB \d+\.\d+.*tcp socket 1 MiB \d+\.\d+", section, re.M)

    targets = out.split("== targets ==")[1]
    for name in ("best kvstore (", "kvstore tcp get 1 MiB single vs mooncake-store",
                 "kvstore tcp put 1 MiB batched x32 vs mooncake-store", "match_prefix vs mooncake-store batch_is_exist",
                 "kvstore shm exists p50 vs mooncake-store"):
        line = next((ln for ln in targets.splitlines() if ln.startswith(name)), None)
        assert line is not None, f"no target line for {name!r} in:\n{out}"
        assert re.search(r"\d+\.\d\d\s+(met|NOT MET)$", line), line

    doc = json.loads(out_json.read_text())
    assert {"shm", "tcp", "mooncake-store"} <= {t["path"] for t in doc["results"]["throughput"]}
    assert doc["results"]["baselines"][0]["unavailable"] is None
    rows = doc["comparison"]["rows"]
    assert rows and all(r["baseline"] > 0 and all(x > 0 for x in r["ratios"].values()) for r in rows)
    assert any(t["name"].startswith("best kvstore") for t in doc["targets"])


def test_comparison_ratios_and_targets_from_known_numbers():
    from kvstore.bench.compare import comparison, unjudged
    from kvstore.bench.report import render, targets
    from kvstore.bench.results import Baseline, Latency, PrefixRate, Results, Throughput

    mib = 1 << 20
    results = Results(
        throughput=[Throughput(p, "get", mib, 1, n, 1.0) for p, n in (("mooncake-store", 1000), ("shm", 6000),
                                                                       ("tcp", 1200))],
        latency=[Latency("mooncake-store", "exists", 4096, 100, 50.0, 90.0),
                 Latency("shm", "exists", 4096, 100, 80.0, 99.0)],
        prefix=[PrefixRate(1000, 10, 0.01, path="mooncake-store"), PrefixRate(1000, 10, 0.02)],
        baselines=[Baseline("mooncake", "mooncake-store", "three processes")])

    rows = {(r.what, r.mode): r for r in comparison(results)}
    assert rows[("get", "single")].ratios == {"shm": 6.0, "tcp": 1.2}
    assert rows[("exists p50", "single")].ratios == {"shm": 1.6}
    assert rows[("prefix match", "1000 keys/call")].ratios == {"kvstore": 0.5}
    checks = {c.name: c for c in targets(results)}
    assert checks["best kvstore (shm) get 1 MiB single vs mooncake-store"].met            # 6 >= 5
    assert not checks["kvstore tcp get 1 MiB single vs mooncake-store"].met              # 1.2 < 1.5
    assert checks["kvstore shm exists p50 vs mooncake-store"].met                         # 1.6 <= 2
    assert not checks["match_prefix vs mooncake-store batch_is_exist (1000 keys/call)"].met
    assert any("kvstore mooncake" in note for note in unjudged(results))
    assert "== kvstore vs Mooncake Store" in render(results)

    gone = Results(baselines=[Baseline("mooncake", "mooncake-store", "three processes", unavailable="setup failed")])
    assert "mooncake: unavailable: setup failed" in render(gone)
    assert not any("vs mooncake-store" in c.name for c in targets(gone))


def test_tiers_section_reports_against_the_raw_disk(tmp_path):
    disk, report = tmp_path / "disk", tmp_path / "bench.json"
    disk.mkdir()
    out = subprocess.run([sys.executable, "-m", "kvstore.cli", "bench", "--quick", "--tiers", "--sections", "tiers",
                          "--tiers-dir", str(disk), "--tiers-size", "64MiB", "--json", str(report)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    [tiers] = json.loads(report.read_text())["results"]["tiers"]
    assert tiers["demote_gbps"] > 0 and set(tiers["read_gbps"]) >= {"shm", "tcp", "raw file"}
    assert "SSD tier" in out.stdout and "raw O_DIRECT write" in out.stdout
    assert "demotion (SSD write)" in out.stdout and "SSD read via shm" in out.stdout
    assert not list(disk.iterdir())              # its files are cleaned up
