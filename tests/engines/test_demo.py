"""`kvstore demo` end to end, shrunk: every request completes, with failures injected."""

import argparse
import re

import pytest

from kvstore.engines import demo
from kvstore.engines.workload import WorkloadConfig, make_workload

pytestmark = pytest.mark.slow


def test_workload_keeps_its_shape_across_salts():
    cfg = WorkloadConfig(requests=30)
    a, b = make_workload(cfg, 0), make_workload(cfg, 1)
    assert [(i.at_s, i.kind, len(i.prompt)) for i in a] == [(i.at_s, i.kind, len(i.prompt)) for i in b]
    assert [i.prompt for i in a] != [i.prompt for i in b]
    shared = [i.prompt[:cfg.prefix_tokens] for i in a if i.kind == "shared"]
    assert len(set(shared)) <= cfg.shared_prefixes < len(shared)


def test_demo_runs_and_plots(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    png = tmp_path / "demo.png"
    args = parser.parse_args(["--requests", "6", "--rate", "6", "--output-tokens", "4", "--failure-rate", "1.0",
                              "--scenarios", "colocated,pd-failures", "--plot", str(png)])
    assert demo.run(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"^colocated\s+6/6 ", out, re.M) and re.search(r"^pd-failures\s+6/6 .* 6 +pd:6", out, re.M)
    assert png.stat().st_size > 10_000
