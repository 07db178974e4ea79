"""The trace bench's pure parts: the simulated caches against hand-computed cases, the pacer on
an injected clock, and the KV sizing."""

import json

import pytest

from kvstore.bench.trace.format import BLOCK_TOKENS, Request
from kvstore.bench.trace.pacing import Pacer
from kvstore.bench.trace.results import rate, timeline
from kvstore.bench.trace.sim import InfiniteCache, LRUCache, simulate, step
from kvstore.bench.trace.sizing import KVSize, kv_bytes_of_model, parse_tokens
from kvstore.bench.trace.synth import SynthSpec, generate


def req(*ids: int, tokens: int | None = None, ts: int = 0) -> Request:
    return Request(ts, tokens if tokens is not None else len(ids) * BLOCK_TOKENS, 1, ids)


def test_lru_evicts_the_least_recently_used_not_the_first_stored():
    cache = LRUCache(2)
    cache.store([1])
    cache.store([2])
    cache.load([1])  # 1 is now the most recent: a FIFO would still evict it next
    cache.store([3])
    cache.check_invariants()
    assert cache.match([1]) == 1 and cache.match([2]) == 0 and cache.match([3]) == 1
    assert cache.evictions == 1


def test_lru_store_of_a_held_block_leaves_its_recency_and_match_changes_nothing():
    cache = LRUCache(2)
    cache.store([1, 2])
    cache.store([1])  # already held: not refreshed (as a put of an existing key)
    assert cache.match([1, 2, 3]) == 2  # a lookup is not a use
    cache.store([3])
    cache.check_invariants()
    assert cache.match([1]) == 0 and cache.match([2, 3]) == 2


def test_requests_through_lru_hand_computed():
    # capacity 3 blocks; block tokens 512; the last block of r2 is partial (100 tokens)
    trace = [
        req(1, 2),  # miss both: holds 1 2
        req(1, 2, 3),  # hits 1 2 (1024 tokens), loads them, stores 3: holds 1 2 3
        req(1, 4, tokens=512 + 100),  # hits 1 (512), stores 4, evicts 2 (1 was just loaded)
        req(1, 2),  # hits 1 only (2 is gone): 512
        req(3, 4),  # 3 was evicted when 2 came back: 0; storing 3 then 4 evicts 4, then 1
    ]
    result = simulate(trace, LRUCache(3))
    assert result.hit_tokens == (0, 1024, 512, 512, 0)
    assert result.evictions == 4 and result.held_blocks == 3
    assert simulate(trace, InfiniteCache()).hit_tokens == (0, 1024, 512, 1024, 1024)


def test_a_hit_counts_only_the_tokens_of_a_partial_last_block():
    cache = InfiniteCache()
    step(cache, req(1, 2, tokens=600))
    assert step(cache, req(1, 2, tokens=600)) == 600
    assert step(cache, req(1, 2, 3, tokens=1500)) == 1024


def test_lru_never_passes_the_infinite_bound_and_reaches_it_when_nothing_is_evicted():
    trace = generate(SynthSpec(requests=300, seed=3))
    infinite = simulate(trace, InfiniteCache())
    unique = len({h for r in trace for h in r.hash_ids})
    for capacity in (16, 64, 256):
        lru = simulate(trace, LRUCache(capacity))
        assert all(h <= i for h, i in zip(lru.hit_tokens, infinite.hit_tokens, strict=True))
    big = simulate(trace, LRUCache(unique))
    assert big.hit_tokens == infinite.hit_tokens and big.evictions == 0
    assert 0 < rate(infinite.hit_tokens, trace) < 1


def test_timeline_splits_by_trace_time():
    trace = [req(1, ts=0), req(1, ts=400), req(2, ts=1000), req(2, ts=1000)]
    hits = [0, 512, 0, 512]
    windows = timeline(trace, hits, hits, hits, windows=2)
    assert [w.requests for w in windows] == [2, 2]
    assert [w.hit.store for w in windows] == [0.5, 0.5]
    assert windows[-1].end_s == 1.0


def test_pacer_waits_for_each_timestamp_divided_by_the_speed():
    now = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = Pacer(2.0, clock=lambda: now[0], sleep=sleep)
    pacer.wait(1000)  # the first request starts the clock
    pacer.wait(3000)  # due 1 s later at 2x
    now[0] += 5.0  # a slow request: the next is late, not waited for
    pacer.wait(4000)
    assert slept == [pytest.approx(1.0)]
    assert pacer.late == 1 and pacer.max_lag_s == pytest.approx(4.5)
    Pacer(0, clock=lambda: 0.0, sleep=sleep).wait(10**9)  # speed 0: never waits
    assert len(slept) == 1
    with pytest.raises(ValueError):
        Pacer(-1)


def test_sizing_scales_a_block_and_aligns_it():
    kv = KVSize(131072, 4096, "llama3-8b")  # 128 KiB a token
    assert kv.block_bytes == BLOCK_TOKENS * 32 and kv.effective_scale == 4096
    assert kv.store_bytes(3_000_000) == (3_000_000 // BLOCK_TOKENS) * kv.block_bytes
    assert kv.segment_bytes(3_000_000) % kv.block_bytes == 0
    odd = KVSize(1000, 3, "flag")  # 512 * 1000 / 3 = 170666.7 B, rounded up to 64
    assert odd.block_bytes % 64 == 0 and 0 < odd.block_bytes - 170666.7 < 64
    assert "in effect" in odd.describe()
    assert KVSize(1, 10**6, "tiny").block_bytes == 64
    with pytest.raises(ValueError):
        KVSize(100, 0.5, "flag")


def test_token_counts():
    assert parse_tokens("3M") == 3_000_000 and parse_tokens("512k") == 512_000 and parse_tokens("1.5M") == 1_500_000
    assert parse_tokens("100000") == 100_000
    for bad in ("lots", "100", "1.5k5"):
        with pytest.raises(ValueError):
            parse_tokens(bad)


def test_kv_bytes_from_a_hf_config_and_a_preset(tmp_path):
    config = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    per_token, source = kv_bytes_of_model(str(tmp_path / "config.json"))
    assert per_token == 2 * 32 * 8 * 128 * 2 and "32 layers" in source
    assert kv_bytes_of_model(str(tmp_path))[0] == per_token  # the model's directory
    assert kv_bytes_of_model("llama3-8b")[0] == per_token
    with pytest.raises(ValueError, match=r"no such config\.json"):
        kv_bytes_of_model(str(tmp_path / "missing.json"))
