import argparse

import pytest

from kvstore.engines import plan


def run_plan(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    assert plan.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_7b_figures(capsys):
    shape = plan.PRESETS["llama2-7b"]                        # 32 layers, hidden 4096, fp16
    assert shape.kv_bytes_per_token == 512 * 1024             # 0.5 MiB per token
    p = plan.Plan(shape, 4096, 80 << 30, plan.Workload(), plan.Throughput(10000, 2000, 40))
    assert p.kv_bytes_per_request == 2 << 30                  # 4K tokens: 2 GiB
    assert p.requests_per_instance == 40
    out = run_plan(capsys, "--model", "llama2-7b", "--context", "4096")
    assert "0.50 MiB" in out and "2.00 GiB" in out
    custom = run_plan(capsys, "--layers", "32", "--hidden", "4096", "--heads", "32", "--dtype", "fp16",
                      "--context", "4096")
    assert "0.50 MiB" in custom and "2.00 GiB" in custom


def test_instance_counts():
    p = plan.Plan(plan.PRESETS["llama3-8b"], 2304, 16 << 30, plan.Workload(4.0, 2048, 256),
                  plan.Throughput(prefill_tps=3000, decode_tps=500, stream_tps=50))
    assert p.prefill_instances == 3                           # ceil(8192 / 3000)
    assert p.concurrent_decodes == pytest.approx(4 * 256 / 50)
    assert p.decode_instances == 3                            # rate: ceil(1024 / 500) = 3; memory: 1
    small = plan.Plan(plan.PRESETS["llama2-7b"], 4096, 4 << 30, plan.Workload(4.0, 2048, 256),
                      plan.Throughput(3000, 5000, 50))
    assert small.requests_per_instance == 2
    assert small.decode_instances == 11                       # memory-bound: ceil(20.48 / 2)


def test_measured_on_the_reference_engine(capsys):
    out = run_plan(capsys, "--model", "reference", "--measure", "--memory", "1GiB")
    assert "measured on the reference engine" in out and "4.00 KiB" in out
