"""`kvstore bench --quick` end to end: it starts its own meta and daemon, measures, and reports.

Only the shape of the report is checked; the numbers depend on the machine and are never asserted.
"""

import json
import re
import subprocess
import sys


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
