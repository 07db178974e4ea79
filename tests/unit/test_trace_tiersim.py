"""The two-tier simulator (DRAM over SSD with the store's SSD policies), checked against the
one-tier LRU and by hand: what it reports for `--admission` and per-tier `--eviction` must be what
those policies do."""

import pytest

from kvstore.bench.trace.format import BLOCK_TOKENS, Request
from kvstore.bench.trace.sim import InfiniteCache, LRUCache, simulate
from kvstore.bench.trace.synth import SynthSpec, generate
from kvstore.bench.trace.tiersim import SSD_POLICIES, TwoTiers, main


def req(*ids: int) -> Request:
    return Request(0, len(ids) * BLOCK_TOKENS, 1, ids)


def test_without_an_ssd_it_is_the_exact_lru():
    trace = generate(SynthSpec(requests=300, sessions=20, seed=4))
    alone = simulate(trace, TwoTiers(40, 0, "all"))
    assert alone.hit_tokens == simulate(trace, LRUCache(40)).hit_tokens


@pytest.mark.parametrize(("eviction", "admission"), SSD_POLICIES)
def test_two_tiers_hold_at_most_their_capacity_and_stay_under_the_bound(eviction, admission):
    trace = generate(SynthSpec(requests=300, sessions=20, seed=5))
    cache = TwoTiers(20, 40, admission, eviction)
    result = simulate(trace, cache)
    assert len(cache._dram) <= 20 and len(cache._ssd) <= 40 and not cache._dram.keys() & cache._ssd.keys()
    assert result.total_hit_tokens <= simulate(trace, InfiniteCache()).total_hit_tokens
    assert result.total_hit_tokens >= simulate(trace, LRUCache(20)).total_hit_tokens  # the SSD only adds


def test_reused_admission_writes_only_blocks_read_since_stored():
    cache = TwoTiers(2, 10, "reused")
    for request in (req(1, 2), req(1), req(3, 4)):  # 1 is read; 3 and 4 push 1 and 2 out of DRAM
        simulate([request], cache)
    assert list(cache._ssd) == ["1"] and cache.ssd_writes == 1 and cache.evictions == 1  # 2 was dropped
    every = TwoTiers(2, 10, "all")
    simulate([req(1, 2), req(1), req(3, 4)], every)
    assert sorted(every._ssd) == ["1", "2"] and every.ssd_writes == 2


def test_a_block_read_twice_on_ssd_comes_back_to_dram():
    cache = TwoTiers(1, 10, "all", promote_after=2)
    simulate([req(1), req(2), req(1), req(1)], cache)  # 1 demoted by 2, then read twice from SSD
    assert list(cache._dram) == ["1"] and cache.ssd_hits == 2 and "2" in cache._ssd


def test_the_table_has_a_row_per_ssd_policy(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(r.to_json() for r in generate(SynthSpec(requests=60))) + "\n")
    main([str(path), "--dram", "5K", "--ssd", "20K"])
    rows = [line.split(" | ")[3] for line in capsys.readouterr().out.splitlines() if line.startswith("| t |")]
    assert rows == ["-"] + [f"{e} / {a}" for e, a in SSD_POLICIES]
