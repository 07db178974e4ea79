"""`kvstore plan --measure`: instance counts from measured throughputs and the SLOs, checked against
a simulated run at the planned rate (the engine's scheduler on a virtual clock): the planned fleet
meets the SLOs, one instance fewer of either kind does not."""

import argparse
import math

import pytest

from kvstore.engines import plan
from kvstore.engines.plan_measure import (
    FleetWorkload,
    Objectives,
    PlanError,
    check,
    erlang_c,
    prefill_wait_s,
    size_fleet,
)
from kvstore.engines.planner.fleet import FleetLoad, StepCost, simulate_fleet

# What the reference engine measures here, rounded: 7,000 prompt tokens/s, and decode steps that
# grow with the batch (memory bound past a few streams).
COST = StepCost(7000.0, ((1, 0.003), (4, 0.006), (16, 0.020), (64, 0.080)))
SLO = Objectives(ttft_s=1.0, tpot_s=0.025, attainment=0.9)


@pytest.mark.parametrize("rate", [15.6, 19.5], ids=["formulas", "queue-headroom"])
def test_the_planned_fleet_meets_the_slo_and_one_fewer_does_not(rate):
    p = size_fleet(FleetWorkload(rate, 1024, 128), SLO, COST, max_batch=64)
    assert p.batch == 20  # the largest batch with a step <= 25 ms
    assert p.decode_base == math.ceil(rate * 128 / (20 / COST.decode_step_s(20)))
    assert p.prefill_base == math.ceil(rate * 1024 / COST.prefill_tps)
    if rate == 19.5:
        assert p.prefill_instances == p.prefill_base + 1  # 3 would run at 95 %: TTFT queues
    attained = check(p)
    planned = (p.prefill_instances, p.decode_instances)
    assert attained[planned] >= SLO.attainment
    assert attained[(planned[0] - 1, planned[1])] < SLO.attainment
    assert attained[(planned[0], planned[1] - 1)] < SLO.attainment


def test_step_cost_interpolates_and_extends():
    assert COST.decode_step_s(4) == pytest.approx(0.006)
    assert COST.decode_step_s(10) == pytest.approx(0.013)
    assert COST.decode_step_s(128) == pytest.approx(0.160)  # along the last segment
    assert COST.step_s(4, 700) == pytest.approx(0.006 + 0.1)
    with pytest.raises(ValueError):
        StepCost(7000.0, ((4, 0.01), (2, 0.02)))


def test_erlang_c_and_the_prefill_queue():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: an arrival waits with probability rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert prefill_wait_s(2, 1.0, 0.1, 0.9) == 0.0  # lightly loaded: no wait at p90
    assert math.isinf(prefill_wait_s(2, 25.0, 0.1, 0.9))  # over capacity


def test_slos_no_fleet_can_meet_are_refused():
    with pytest.raises(PlanError, match="TPOT"):
        size_fleet(FleetWorkload(1, 1024, 128), Objectives(1.0, 0.002), COST, 64)
    with pytest.raises(PlanError, match="TTFT"):
        size_fleet(FleetWorkload(1, 8192, 128), Objectives(1.0, 0.025), COST, 64)


def test_the_simulation_completes_every_request_and_sees_overload():
    load = FleetLoad(request_rate=20, input_tokens=512, output_tokens=64, requests=300)  # 1 + 1 is overloaded
    light, heavy = simulate_fleet(2, 2, load, COST), simulate_fleet(1, 1, load, COST)
    assert len(light.ttft_s) == len(heavy.ttft_s) == 300
    assert max(light.ttft_s) < max(heavy.ttft_s)
    assert light.attainment(1.0, 0.025) > heavy.attainment(1.0, 0.025)


@pytest.mark.slow
def test_plan_measure_on_the_reference_engine(capsys):
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    args = parser.parse_args(
        [
            "--model",
            "reference",
            "--measure",
            "--input-tokens",
            "256",
            "--output-tokens",
            "32",
            "--batches",
            "1,4",
            "--request-rate",
            "2",
            "--slo-tpot",
            "0.5",
        ]
    )
    assert plan.run(args) == 0
    out = capsys.readouterr().out
    assert "measured on the reference engine" in out and "B* = " in out
    assert "prefill instances" in out and "(planned)" in out


@pytest.mark.slow
def test_plan_measure_on_a_running_instance(capsys):
    from kvstore.engines.launch import Fleet

    with Fleet() as fleet:
        _, meta = fleet.store("128MiB")
        _, engine = fleet.engine("colocated", meta, "--threads", "1")
        parser = argparse.ArgumentParser()
        plan.add_arguments(parser)
        args = parser.parse_args(
            [
                "--measure",
                "--instance",
                engine,
                "--input-tokens",
                "128",
                "--output-tokens",
                "16",
                "--batches",
                "1,3",
                "--request-rate",
                "2",
                "--slo-tpot",
                "0.5",
                "--no-check",
            ]
        )
        assert plan.run(args) == 0
    out = capsys.readouterr().out
    assert f"measured on {engine}" in out and "B=3" in out and "decode instances" in out


def test_slos_no_fleet_meets_exit_1_with_the_reason_on_stderr(capsys):
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    argv = ["--model", "reference", "--measure", "--input-tokens", "32", "--output-tokens", "4", "--batches", "1"]
    args = parser.parse_args([*argv, "--slo-tpot", "1e-9", "--no-check"])  # no decode step is that fast
    assert plan.run(args) == 1
    out = capsys.readouterr()
    assert "measured on the reference engine" in out.out and "no fleet meets" not in out.out
    assert out.err.startswith("kvstore plan: no fleet meets these SLOs: one stream's decode step takes"), out.err
