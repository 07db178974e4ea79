"""Local caches against the global pool (benchmarks/fleet/trace_pool.py) on a small generated trace,
4 prefill nodes: on real daemons across fleet hosts, the pool hits at least as often as local
caches, and with local caches every node read only its own daemon while the pool's nodes read
each other's. The same
properties hold for the simulated pools, and the prefill cost model is the planner's."""

from __future__ import annotations

import pytest

from benchmarks.fleet.netns import Fleet
from benchmarks.fleet.pool_caches import Sharing, SimPool
from benchmarks.fleet.pool_fleet import FleetPool
from benchmarks.fleet.pool_replay import PoolRun, run_pool
from benchmarks.fleet.pool_router import PoolRouter
from benchmarks.fleet.prefill_cost import PrefillCost
from benchmarks.fleet.trace_pool import node_names
from kvstore.bench.trace.format import BLOCK_TOKENS
from kvstore.bench.trace.sizing import KVSize
from kvstore.bench.trace.synth import SynthSpec, generate
from kvstore.engines.planner.model import PRESETS

NODES = 4
CAPACITY = 64 * BLOCK_TOKENS  # per node: small against the trace, so local caches evict; > any prompt
TRACE = generate(SynthSpec(requests=160, sessions=16, system_prompts=4, seed=7))
KV = KVSize(4096, 512.0, "test")  # 4 KiB a block


def check_run(run: PoolRun) -> None:
    assert run.requests == len(TRACE)
    assert sum(run.per_node.values()) == len(TRACE)
    assert 0 <= run.hit_tokens <= run.prompt_tokens
    assert run.prefill_s <= run.full_prefill_s


def test_across_fleet_hosts_the_pool_hits_more_and_local_nodes_read_only_their_own_daemon(net: Fleet):
    """Each node a host of its own (its daemon and its client; another node's daemon only across
    the bridge, over tcp), as the paper's prefill nodes are machines of their own."""
    del net  # the fixture skips where namespaces cannot be made; FleetPool makes its own fleet
    runs = []
    for sharing in Sharing:
        pool = FleetPool(sharing, node_names(NODES), CAPACITY, KV, lease_ttl_s=1.0)  # puts wait less for space
        try:
            runs.append(run_pool(TRACE, pool.start(max(len(r.hash_ids) for r in TRACE)), PrefillCost(), 2.5))
        finally:
            pool.close()
        assert (pool.bad_loads, pool.failed_puts) == (0, 0), pool.first_error
    local, pooled = runs
    check_run(local)
    check_run(pooled)
    assert local.loaded_blocks > 0, "the local run must load something for its reads to say anything"
    assert local.only_own_reads(), local.reads
    assert local.remote_blocks == 0
    assert sum(bool(r) for r in local.reads.values()) > 1, "more than one node served hits"
    assert not pooled.only_own_reads(), "a pool's nodes read each other's daemons"
    assert pooled.remote_blocks > 0
    assert pooled.hit_rate >= local.hit_rate


@pytest.mark.parametrize("arrival_scale", [1.0, 100.0])
def test_simulated_pools_keep_the_same_properties(arrival_scale: float):
    runs = {}
    for sharing in Sharing:
        caches = SimPool(sharing, node_names(NODES), CAPACITY // BLOCK_TOKENS)
        runs[sharing] = run_pool(TRACE, caches, PrefillCost(), arrival_scale)
        check_run(runs[sharing])
    assert runs[Sharing.LOCAL].only_own_reads()
    assert runs[Sharing.GLOBAL].hit_rate >= runs[Sharing.LOCAL].hit_rate


def test_the_router_prefers_the_node_holding_the_prefix_until_its_queue_costs_more():
    cost = PrefillCost()
    router = PoolRouter(node_names(2), cost)
    n = 8 * BLOCK_TOKENS
    assert router.choose(0.0, n, {"node0": 0, "node1": 4 * BLOCK_TOKENS}, 0) == "node1"
    router.admit("node1", 0.0, 200_000, 0)  # a long prefill queued on node1
    assert router.choose(0.0, n, {"node0": 0, "node1": 4 * BLOCK_TOKENS}, 0) == "node0"


def test_prefill_cost_is_the_planners_compute_bound_estimate():
    cost = PrefillCost(PRESETS["llama3-70b"])
    n = 10_000
    assert cost.seconds(n, n) == 0.0
    assert cost.seconds(n, n // 2) == pytest.approx(cost.seconds(n) / 2)
    assert cost.seconds(n) == pytest.approx(n / cost.tokens_per_s(n))
    assert 0 < cost.load_weight(n) < 1  # at 200 Gbit/s loading a token is cheaper than computing it
    with pytest.raises(ValueError):
        PrefillCost(PRESETS["llama3-70b"].__class__("no-params", 2, 2, 64))
