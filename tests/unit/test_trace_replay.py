"""`kvstore bench trace` end to end: a generated trace replayed through the CLI against real
stores (the ones it starts per capacity, and a `kvstore serve` on port 0 via --meta), its JSON
checked against the simulators. Hit rates are compared as properties, never wall-clock times."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore.bench.trace.format import BLOCK_TOKENS, write_trace
from kvstore.bench.trace.results import rate
from kvstore.bench.trace.sim import LRUCache, simulate
from kvstore.bench.trace.synth import SynthSpec, generate
from kvstore.config import MetaConfig
from tests.cluster import _env

REPO = Path(__file__).resolve().parents[2]
SPEC = SynthSpec(requests=400, sessions=8, system_blocks=4, turn_blocks=(1, 3), turns=(2, 6), seed=11)


def bench_trace(tmp_path, trace: Path, *args: str, expect: int = 0) -> tuple[str, str, dict[str, Any]]:
    out = tmp_path / "trace.json"
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore.cli", "bench", "trace", str(trace), "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=_env(None),
    )
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc.stdout, proc.stderr, json.loads(out.read_text()) if expect == 0 else {}


@pytest.fixture
def trace_file(tmp_path) -> Path:
    path = tmp_path / "synth.jsonl"
    write_trace(path, generate(SPEC))
    return path


@pytest.mark.slow
def test_replay_sweep_matches_the_simulators(tmp_path, trace_file):
    requests = generate(SPEC)
    unique = len({h for r in requests for h in r.hash_ids})
    # Blocks: a store that must evict, and one that never passes its high watermark.
    small, room = 60, int(unique / MetaConfig().high_watermark) + 50
    out, err, doc = bench_trace(
        tmp_path, trace_file, "--kv-bytes-per-token", "16", "--scale", "2", "--capacity", f"{small * 512},{room * 512}"
    )
    assert doc["kv"]["block_bytes"] == 16 * BLOCK_TOKENS // 2 and doc["requests"] == SPEC.requests
    tight, ample = doc["points"]
    for point in doc["points"]:
        hit = point["hit"]
        assert hit["store"] <= hit["infinite"] and hit["lru"] <= hit["infinite"]
        assert point["bad_loads"] == point["failed_loads"] == point["failed_puts"] == point["lost_between"] == 0
        assert point["lookup"]["calls"] == SPEC.requests and point["store"]["p99_us"] >= point["store"]["p50_us"] > 0
        assert point["bytes_stored"] > 0 and point["peak_used_bytes"] <= point["capacity_bytes"]
        assert point["throughput"]["requests_per_s"] > 0 and 0 < point["throughput"]["store_share"] < 1
        assert len(point["timeline"]) > 1
    # Room for every block: nothing is evicted, and the store finds exactly what the bound does.
    assert ample["capacity_blocks"] >= unique and ample["evictions"] == 0
    assert ample["hit"]["store"] == pytest.approx(ample["hit"]["infinite"]) == pytest.approx(ample["hit"]["lru"])
    # Too small: the store evicts past its high watermark down to its low one, so it holds between
    # low and high x capacity where the exact LRU holds all of it: it sits between the LRU at the low
    # watermark's share of the capacity (less a block of slack a request) and the LRU at capacity.
    assert tight["capacity_blocks"] == small and tight["evictions"] > 0
    low = simulate(requests, LRUCache(int(small * MetaConfig().low_watermark) - 8))
    assert rate(low.hit_tokens, requests) <= tight["hit"]["store"] <= tight["hit"]["lru"]
    assert "hit rate vs capacity" in out and "hit rate over trace time" in out and "kv/LRU" in out
    assert f"{SPEC.requests}/{SPEC.requests} requests" in err  # the progress bar ran to the end
    assert (tmp_path / "trace.png").exists() or "no PNG" in out


@pytest.mark.slow
def test_replay_against_a_served_store_at_the_trace_timestamps(tmp_path, cluster):
    spec = SynthSpec(requests=60, rate_per_s=40, seed=5)
    path = tmp_path / "paced.jsonl"
    requests = generate(spec)
    write_trace(path, requests)
    _, address = cluster.serve("4MiB")
    _, _, doc = bench_trace(
        tmp_path, path, "--meta", address, "--model", "llama3-8b", "--scale", "4096", "--speed", "4"
    )
    (point,) = doc["points"]
    assert doc["meta"] == address and doc["speed"] == 4
    assert point["capacity_bytes"] == 4 << 20 and point["capacity_blocks"] == (4 << 20) // doc["kv"]["block_bytes"]
    assert point["bad_loads"] == point["failed_loads"] == 0
    assert point["throughput"]["server_cpu_s"] is None  # not its processes
    # Paced: never ahead of the trace's clock, so the replay lasts at least the trace's span / speed.
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000
    assert point["throughput"]["replay_s"] >= span_s / 4 - 0.01 and point["throughput"]["paced_sleep_s"] > 0


def test_a_bad_trace_is_one_error_line_naming_it(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n')
    _, err, _ = bench_trace(tmp_path, path, "--kv-bytes-per-token", "8", "--scale", "1", expect=1)
    assert err.strip().splitlines()[-1] == (
        f"error: TraceFormatError: {path}:1: 1 hash_ids for input_length 600: expected ceil(600 / 512) = 2"
    )


def test_flags_that_cannot_go_together_are_refused(tmp_path, trace_file):
    _, err, _ = bench_trace(
        tmp_path, trace_file, "--kv-bytes-per-token", "8", "--scale", "1", "--meta", "x:1", "--capacity", "1M", expect=2
    )
    assert "with --meta the store's own DRAM is used" in err
    _, err, _ = bench_trace(tmp_path, trace_file, "--model", "nonesuch", "--scale", "1", expect=2)
    assert "--model 'nonesuch'" in err
