"""Router decisions from the pure policy, with a fake clock and fake loads."""

import pytest

from benchmarks.demo.workload import WorkloadConfig, make_workload
from benchmarks.router_sim import SimParams, simulate
from kvstore.clock import FakeClock
from kvstore.engines.router.policy import (
    CostModel,
    CostPolicy,
    DynamoPolicy,
    FixedPolicy,
    InstanceLoad,
    Pools,
    Route,
    RouteRequest,
)
from kvstore.engines.router.telemetry import Telemetry

POOLS = Pools(prefill=("P1", "P2"), decode=("D1", "D2"), colocated=("C",))
MODEL = CostModel(kv_bytes_per_token=4096, default_bandwidth=1e9, default_prefill_tps=2000.0)


def policy(clock=None, model=MODEL):
    clock = clock or FakeClock()
    return CostPolicy(model, Telemetry(model, clock.now)), clock


def test_a_cached_prefix_goes_straight_to_decode():
    p, _ = policy()
    d = p.decide(RouteRequest(2000, 1920), POOLS, {"D1": InstanceLoad(3, 500)})
    assert (d.route, d.target, d.prefill) == (Route.DECODE, "D2", None)  # least-loaded decode
    assert "cached" in d.reason
    d = p.decide(RouteRequest(3000, 2950), POOLS, {})  # 98% cached
    assert d.route is Route.DECODE
    d = p.decide(RouteRequest(200, 160), POOLS, {})  # only 40 tokens left
    assert d.route is Route.DECODE
    assert p.decide(RouteRequest(2000, 1000), POOLS, {}).route is not Route.DECODE


def test_a_short_prompt_stays_colocated():
    p, _ = policy()
    d = p.decide(RouteRequest(300), POOLS, {})
    assert (d.route, d.target) == (Route.COLOCATED, "C") and "short" in d.reason


def test_a_store_less_colocated_instance_counts_the_whole_prompt():
    p, _ = policy()
    pools = Pools(POOLS.prefill, POOLS.decode, POOLS.colocated, storeless=frozenset({"C"}))
    # 1200 of 1500 cached: 300 uncached is "short", but C would recompute all 1500.
    assert p.decide(RouteRequest(1500, 1200), POOLS, {}).reason.startswith("short")
    assert not p.decide(RouteRequest(1500, 1200), pools, {}).reason.startswith("short")


def test_disaggregates_when_the_transfer_costs_less_than_it_saves():
    p, _ = policy()
    busy = {"C": InstanceLoad(requests=2, tokens=1500), "P1": InstanceLoad(1, 900), "D1": InstanceLoad(1, 0)}
    d = p.decide(RouteRequest(4000), POOLS, busy)
    assert (d.route, d.prefill, d.target) == (Route.PD, "P2", "D2")  # load-aware on both sides
    assert d.transfer_s < d.saved_s and "pd:" in d.reason


def test_an_idle_colocated_instance_wins_over_any_transfer():
    p, _ = policy()
    d = p.decide(RouteRequest(4000), POOLS, {})
    assert d.route is Route.COLOCATED and d.saved_s == 0 and d.transfer_s > 0


def test_a_slow_link_measured_from_recent_transfers_keeps_requests_colocated():
    p, clock = policy()
    busy = {"C": InstanceLoad(requests=1, tokens=0)}
    assert p.decide(RouteRequest(4000), POOLS, busy).route is Route.PD  # assumed 1 GB/s
    p.telemetry.record_transfer(nbytes=10_000_000, seconds=1.0)  # measured: 10 MB/s
    d = p.decide(RouteRequest(4000), POOLS, busy)
    assert d.route is Route.COLOCATED and d.transfer_s >= d.saved_s and "10 MB/s" in d.reason
    clock.advance(MODEL.window_s + 1)  # the measurement ages out
    assert p.telemetry.bandwidth() == MODEL.default_bandwidth
    assert p.decide(RouteRequest(4000), POOLS, busy).route is Route.PD


def test_future_arrivals_at_the_colocated_instance_count():
    p, clock = policy()
    assert p.decide(RouteRequest(2000), POOLS, {}).route is Route.COLOCATED
    for _ in range(20):  # 2 req/s land on C
        p.telemetry.record_arrival("C")
        clock.advance(0.5)
    assert p.telemetry.arrival_rate("C") == pytest.approx(2.0)
    assert p.decide(RouteRequest(2000), POOLS, {}).route is Route.PD


def test_every_decision_explains_its_estimate():
    p, _ = policy()
    p.telemetry.record_transfer(nbytes=50_000_000, seconds=0.5)  # measured: 100 MB/s
    loads = {"C": InstanceLoad(requests=3, tokens=800), "P1": InstanceLoad(1, 200), "P2": InstanceLoad(1, 200)}
    for req, rule in ((RouteRequest(300), "short"), (RouteRequest(4000), "cost"), (RouteRequest(2000, 1950), "cached")):
        d = p.decide(req, POOLS, loads)
        assert d.rule == rule
        if rule == "cached":
            assert d.estimate is None
            continue
        est = d.estimate
        n_local = req.uncached_tokens
        assert est.kv_bytes == (req.prompt_tokens + n_local) * MODEL.kv_bytes_per_token
        assert est.bandwidth == 100e6 and est.transfer_s == pytest.approx(est.kv_bytes / 100e6)
        assert est.queue_saved_s == pytest.approx((800 - 200) / MODEL.default_prefill_tps)
        assert est.saved_s == pytest.approx(est.compute_saved_s + est.queue_saved_s + est.interference_saved_s)
        assert (d.transfer_s, d.saved_s) == (est.transfer_s, est.saved_s)
        assert "100 MB/s" in d.reason and "interference" in d.reason


def test_a_full_prefill_queue_sends_work_to_colocated():
    p, _ = policy()
    full = {u: InstanceLoad(MODEL.max_prefill_queue, 8000) for u in POOLS.prefill}
    d = p.decide(RouteRequest(4000), POOLS, {**full, "C": InstanceLoad(5, 5000)})
    assert d.route is Route.COLOCATED and "queue full" in d.reason


def test_without_a_prefill_pool_everything_is_local():
    p, _ = policy()
    d = p.decide(RouteRequest(8000), Pools(decode=("D1",)), {})
    assert (d.route, d.target) == (Route.COLOCATED, "D1")


def test_prefill_throughput_is_measured():
    p, _clock = policy()
    p.telemetry.record_prefill(tokens=5000, seconds=1.0)
    p.telemetry.record_prefill(tokens=1000, seconds=1.0)
    assert p.telemetry.prefill_tps() == 3000.0


def test_dynamo_baseline_thresholds():
    d = DynamoPolicy(MODEL)
    assert d.decide(RouteRequest(1001), POOLS, {}).route is Route.PD
    assert d.decide(RouteRequest(1000), POOLS, {}).route is Route.COLOCATED
    full = {u: InstanceLoad(MODEL.max_prefill_queue, 0) for u in POOLS.prefill}
    assert d.decide(RouteRequest(5000), POOLS, full).route is Route.COLOCATED


def test_fixed_routes():
    assert FixedPolicy(Route.COLOCATED, MODEL).decide(RouteRequest(5000, 4990), POOLS, {}).route is Route.COLOCATED
    pd = FixedPolicy(Route.PD, MODEL)
    assert pd.decide(RouteRequest(40), POOLS, {}).route is Route.PD
    assert pd.decide(RouteRequest(5000, 4990), POOLS, {}).route is Route.DECODE


def _cost(req: RouteRequest, route: Route, loads, t: Telemetry, pools=POOLS) -> float:
    """The documented cost of a route (what CostPolicy minimises)."""
    m, tps, bw = MODEL, t.prefill_tps(), t.bandwidth()
    n, u = req.prompt_tokens, req.uncached_tokens

    def link(k):
        return k * m.kv_bytes_per_token / bw

    def delay(inst, k):
        lo = loads.get(inst, InstanceLoad())
        busy = k / tps
        streams = 0 if inst in pools.prefill else lo.requests
        return lo.tokens / tps + m.interference_weight * (busy * streams + t.arrival_rate(inst) * busy**2 / 2)

    if route is Route.PD:
        return u / tps + link(2 * n) + delay("P1", u)
    return u / tps + link(n - u) + delay("C", u)


@pytest.mark.parametrize("bandwidth", [5e6, 50e6, 1e9])
def test_on_long_prompts_the_cost_rule_is_never_worse_than_dynamo(bandwidth):
    pools = Pools(("P1",), ("D1",), ("C",))
    clock = FakeClock()
    t = Telemetry(MODEL, clock.now)
    t.record_transfer(int(bandwidth), 1.0)
    cost, dynamo = CostPolicy(MODEL, t), DynamoPolicy(MODEL)
    for n in (1200, 3000, 8000):
        for c_req, c_tok in ((0, 0), (1, 500), (4, 6000)):
            for p_req in (0, 2):
                loads = {"C": InstanceLoad(c_req, c_tok), "P1": InstanceLoad(p_req, 1000 * p_req)}
                req = RouteRequest(n)
                ours, theirs = cost.decide(req, pools, loads), dynamo.decide(req, pools, loads)
                assert _cost(req, ours.route, loads, t) <= _cost(req, theirs.route, loads, t) + 1e-12


@pytest.mark.parametrize("bandwidth,rate", [(300e6, 1.0), (300e6, 2.0), (20e6, 1.0)])
def test_in_simulation_the_cost_policy_beats_or_equals_dynamo(bandwidth, rate):
    items = make_workload(WorkloadConfig(requests=200, rate=rate))
    params = SimParams(bandwidth=bandwidth)
    ours, baseline = simulate("cost", items, params), simulate("dynamo", items, params)
    assert len(ours.ttft_s) == len(items)
    assert ours.mean_ttft <= baseline.mean_ttft
    assert ours.p99_ttft <= baseline.p99_ttft
