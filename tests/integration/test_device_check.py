"""scripts/device_check.sh as its CPU dry run: every section runs or says why not, the results
file holds what docs/gpu.md points to, and a section that fails does not stop the others."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, *args):
    env = dict(os.environ, OUT=str(tmp_path))
    done = subprocess.run(
        ["bash", "scripts/device_check.sh", "--cpu", "--quick", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, json.loads((tmp_path / "device_check.json").read_text())


@pytest.mark.slow
def test_the_dry_run_covers_every_section(tmp_path):
    done, results = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    s = results["sections"]
    assert results["mode"] == "cpu" and list(s) == ["env", "tests", "copies", "ttft", "metascale", "vllm_tier"]
    assert all(r["status"] == "ok" for n, r in s.items() if n not in ("metascale", "vllm_tier")), s
    assert s["metascale"]["status"] == "skipped" and "issue 15" in s["metascale"]["reason"]
    assert s["vllm_tier"]["status"] == "skipped" and "--quick" in s["vllm_tier"]["reason"]
    assert "skipped" in s["tests"]["data"]["gpu_marked"]["summary"]  # collected, and skipped here
    assert "passed" in s["tests"]["data"]["host_stand_in"]["summary"]
    ids = {r.get("id") for r in s["copies"]["data"]["rates"]}
    assert {"memcpy", "d2d", "get_gpu", "get_dram"} <= ids
    assert any("needs CUDA" in r.get("reason", "") for r in s["copies"]["data"]["rates"])
    ttft = s["ttft"]["data"]["results"]
    assert {r["store"] for r in ttft} == {"dram tier over shm", "gpu tier over tcp"}
    assert all(r["same_first_token"] and r["cached_tokens"] > 0 for r in ttft)
    assert "== device_check (cpu) ==" in done.stdout


def test_a_failing_section_is_reported_and_the_rest_run(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSTORE_META_SCALING_CMD", "false")  # a scaling "script" that fails
    done, results = run(tmp_path, "--sections", "metascale,env")
    assert done.returncode == 1
    assert results["sections"]["metascale"]["status"] == "error"
    assert results["sections"]["env"]["status"] == "ok"  # it still ran, after the failure
    assert "metascale: error" in done.stdout
