"""`kvstore demo` end to end, shrunk: every scenario completes every request (failures injected in
one), and the report names the targets; the workloads keep their shapes."""

import argparse
import json
import re

import pytest

from benchmarks.demo import scenarios as demo
from benchmarks.demo.workload import MIXES, SHAPES, ShapedConfig, WorkloadConfig, make_shaped, make_workload


def test_workload_keeps_its_shape_across_salts():
    cfg = WorkloadConfig(requests=30)
    a, b = make_workload(cfg, 0), make_workload(cfg, 1)
    assert [(i.at_s, i.kind, len(i.prompt)) for i in a] == [(i.at_s, i.kind, len(i.prompt)) for i in b]
    assert [i.prompt for i in a] != [i.prompt for i in b]
    shared = [i.prompt[: cfg.prefix_tokens] for i in a if i.kind == "shared"]
    assert len(set(shared)) <= cfg.shared_prefixes < len(shared)


@pytest.mark.parametrize("mix", list(MIXES))
def test_shaped_workloads(mix):
    a, b = make_shaped(ShapedConfig(mix, 60, 4.0), 0), make_shaped(ShapedConfig(mix, 60, 4.0), 1)
    assert [(i.at_s, i.kind, len(i.prompt), i.max_tokens, i.follows) for i in a] == [
        (i.at_s, i.kind, len(i.prompt), i.max_tokens, i.follows) for i in b
    ]
    assert {i.kind for i in a} == set(MIXES[mix]) and len(a) == 60
    for i, item in enumerate(a):
        shape = SHAPES[item.kind]
        lo, hi = shape.input_tokens if item.follows is None else shape.follow_up_tokens
        assert lo <= len(item.prompt) <= hi and shape.output_tokens[0] <= item.max_tokens <= shape.output_tokens[1]
        if item.follows is not None:  # a later turn of the same kind of conversation
            before = a[item.follows]
            assert item.follows < i and before.kind == item.kind == "chat"
            assert item.at_s >= before.at_s + shape.think_s
    if mix in ("chat", "mixed"):
        assert any(i.follows is not None for i in a)


@pytest.mark.slow
def test_demo_runs_and_plots(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    png, report = tmp_path / "demo.png", tmp_path / "demo.json"
    args = parser.parse_args(
        [
            "--workloads",
            "mixed",
            "--requests",
            "6",
            "--rate",
            "6",
            "--sweep",
            "0.5",
            "--serial-requests",
            "3",
            "--failure-rate",
            "1.0",
            "--plot",
            str(png),
            "--json",
            str(report),
            "--scenarios",
            "colocated,pd,hybrid,pd-failures",
        ]
    )
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    for scenario in ("colocated", "pd", "hybrid", "pd-failures"):
        for rate in ("6", "3"):
            assert re.search(rf"^mixed/{scenario}@{rate}\s+6/6 ", out, re.M), (scenario, rate)
    assert re.search(r"^mixed/colocated@6 .*colocated:6$", out, re.M)
    # every request that loaded KV on the decode instance had its load cut short, and completed
    failing = re.search(r"^mixed/pd-failures@6 .* (\d+)  (decode:\d+ )?pd:\d+$", out, re.M)
    assert failing and int(failing.group(1)) == 6
    assert "PD TPOT p99 / colocated" in out and "continuous batching" in out and "hybrid routes" in out
    figures = json.loads(report.read_text())
    assert set(figures["targets"]) >= {"pd_tpot_p99_over_colocated", "hybrid_goodput", "batching_over_serial"}
    assert png.stat().st_size > 10_000
