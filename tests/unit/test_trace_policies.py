"""The policy study's pure parts: Belady's offline policy against a hand-computed case and as an
upper reference, and every candidate policy keeping its capacity (check_invariants after each
request) and never beating the infinite bound, on generated shared-prefix traces."""

import pytest

from kvstore.bench.trace.belady import NEVER, belady, next_uses
from kvstore.bench.trace.format import BLOCK_TOKENS, Request
from kvstore.bench.trace.sim import InfiniteCache, LRUCache, simulate, step
from kvstore.bench.trace.study import CANDIDATES, main
from kvstore.bench.trace.synth import SynthSpec, generate


def req(*ids: int) -> Request:
    return Request(0, len(ids) * BLOCK_TOKENS, 1, ids)


def test_next_uses_name_the_next_request_holding_each_block():
    trace = [req(1, 2), req(1, 3), req(2, 3)]
    assert next_uses(trace) == [[1, 2], [NEVER, 2], [NEVER, NEVER]]


def test_belady_keeps_the_block_needed_soonest_and_bypasses_one_never_needed():
    trace = [req(1), req(2), req(3), req(1), req(2)]
    # capacity 2: 3 is needed never again, so it is not stored, and 1 and 2 both hit
    result = belady(trace, 2)
    assert result.hit_tokens == (0, 0, 0, BLOCK_TOKENS, BLOCK_TOKENS)
    assert simulate(trace, LRUCache(2)).total_hit_tokens == 0  # LRU evicts each just before its use


@pytest.mark.parametrize("name", sorted(CANDIDATES))
def test_each_candidate_stays_within_capacity_and_under_the_bound(name):
    trace = generate(SynthSpec(requests=300, sessions=20, seed=3))
    cache = CANDIDATES[name](40)
    hits = 0
    for request in trace:
        hits += step(cache, request)
        cache.check_invariants()  # type: ignore[attr-defined]
    assert hits <= simulate(trace, InfiniteCache()).total_hit_tokens
    assert hits <= belady(trace, 40).total_hit_tokens or name == "tinylfu"  # Belady is the reference


def test_belady_beats_lru_on_a_generated_trace():
    trace = generate(SynthSpec(requests=400, sessions=30, seed=1))
    assert belady(trace, 60).total_hit_tokens > simulate(trace, LRUCache(60)).total_hit_tokens


def test_the_study_prints_one_row_per_policy_and_bound(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(r.to_json() for r in generate(SynthSpec(requests=60))) + "\n")
    main([str(path), "--capacity", "20K", "--policies", "lru,arc"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| t |")]
    assert [row.split(" | ")[2] for row in rows] == ["lru", "arc", "belady", "infinite"]
