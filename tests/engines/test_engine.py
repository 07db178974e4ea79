"""The reference engine's PD path in process: KV through kvstore gives colocated's exact tokens,
shared prefixes are computed once, and every failed transfer falls back to recompute."""

import threading

import pytest
import torch

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.keys import Granularity
from kvstore.engines.reference.connector import FaultInjector
from kvstore.engines.reference.engine import EngineConfig, GenerationRequest, ReferenceEngine, Role
from kvstore.engines.reference.model import ModelConfig, ReferenceModel
from tests.engines.fakes import MemoryStore

BS = 16


@pytest.fixture(scope="module")
def model():
    return ReferenceModel(ModelConfig())


@pytest.fixture(scope="module")
def store_address():
    from tests.cluster import Cluster

    cluster = Cluster()
    _, address = cluster.serve("256MiB")
    yield address
    cluster.close()


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def engine(model, role, store=None, **kw) -> ReferenceEngine:
    return ReferenceEngine(model, EngineConfig(role, block_size=BS, cache_blocks=256, **kw), store)


def run(e: ReferenceEngine, prompt, max_tokens=12, expected=0):
    streamed: list[int] = []
    gen = e.generate(GenerationRequest("r", prompt, max_tokens, expected), streamed.append)
    assert streamed == gen.tokens
    e.cache.check_invariants()
    assert e.cache.num_free == e.cache.shape.num_blocks  # every block back after the request
    return gen


def pd(prefill, decode, prompt, max_tokens=12):
    """What the router does: prefill, then decode expecting every full block of the prompt."""
    pre = run(prefill, prompt)
    dec = run(decode, prompt, max_tokens, expected=len(prompt) // BS * BS)
    return pre, dec


@pytest.mark.parametrize("granularity", list(Granularity))
def test_decode_from_kvstore_matches_colocated(model, store_address, granularity):
    colocated = engine(model, Role.COLOCATED)
    with KVClient(store_address) as kv:
        prefill = engine(model, Role.PREFILL, kv, granularity=granularity, tenant=f"eq-{granularity.value}")
        decode = engine(model, Role.DECODE, kv, granularity=granularity, tenant=f"eq-{granularity.value}")
        base = tokens(600, seed=1)
        shared = base[:300] + tokens(77, seed=2)  # shares 18 full blocks with `base`
        for prompt in (base[:37], base[:160], base, shared):  # 37 and 600: not multiples of 16
            want = run(colocated, prompt).tokens
            pre, dec = pd(prefill, decode, prompt)
            assert dec.tokens == want, len(prompt)
            assert pre.tokens[0] == want[0]
            full = len(prompt) // BS * BS
            assert pre.kv_transfer_params["cached_tokens"] == full
            # decode loads every full block it may (at least one prompt token is always computed)
            assert dec.metrics.cached_tokens == min(full, (len(prompt) - 1) // BS * BS)
            assert dec.metrics.fallback is None
        assert len({run(colocated, p).tokens[0] for p in (base[:37], base[:160], shared)}) > 1


def test_a_shared_prefix_is_computed_once(model, store_address):
    with KVClient(store_address) as kv:
        prefill = engine(model, Role.PREFILL, kv, tenant="prefix")
        first = tokens(700, seed=3)
        second = first[:640] + tokens(45, seed=4)
        a = run(prefill, first)
        assert (a.metrics.cached_tokens, a.metrics.prefill_tokens) == (0, 700)
        b = run(prefill, second)
        assert (b.metrics.cached_tokens, b.metrics.prefill_tokens) == (640, 45)
        assert b.metrics.kv_load_bytes == 640 * model.config.kv_bytes_per_token
        assert b.metrics.kv_save_bytes == 2 * BS * model.config.kv_bytes_per_token  # 2 new full blocks
        decode = engine(model, Role.DECODE, kv, tenant="prefix")
        assert run(decode, second, expected=672).tokens == run(engine(model, Role.COLOCATED), second).tokens


def test_missing_kv_is_recomputed_and_counted(model):
    store = MemoryStore()
    decode = engine(model, Role.DECODE, store)
    prompt = tokens(200, seed=5)
    gen = run(decode, prompt, expected=192)  # the router promised 12 blocks
    assert gen.metrics.fallback == "miss" and gen.metrics.prefill_tokens == 200
    m = gen.metrics
    # no load was tried; the decode instance saved its output's blocks back (and that worked)
    assert (m.kv_lookup_failed, m.kv_load_failed, m.kv_save_failed, m.kv_missing_tokens) == (False, None, False, 192)
    assert gen.tokens == run(engine(model, Role.COLOCATED), prompt).tokens


def test_failed_transfers_fall_back_part_way(model):
    store = MemoryStore()
    prefill = engine(model, Role.PREFILL, store)
    decode = ReferenceEngine(
        model,
        EngineConfig(Role.DECODE, block_size=BS, cache_blocks=256),
        store,
        FaultInjector(load_failure_rate=1.0, seed=3),
    )
    want = run(engine(model, Role.COLOCATED), tokens(330, seed=6)).tokens
    _pre, dec = pd(prefill, decode, tokens(330, seed=6))
    assert dec.metrics.fallback == "injected"
    assert dec.metrics.cached_tokens < 320 and dec.metrics.prefill_tokens == 330 - dec.metrics.cached_tokens
    assert dec.metrics.kv_load_failed and dec.metrics.kv_missing_tokens == 320 - dec.metrics.cached_tokens
    assert dec.tokens == want
    store.fail_keys.add(prefill.scheme.key(prefill.scheme.block_hashes(tokens(330, seed=6))[4], 2))
    assert decode.connector is not None
    decode.connector.faults.configure(0.0)
    dec = run(decode, tokens(330, seed=6), expected=320)
    assert (dec.metrics.fallback, dec.metrics.cached_tokens) == ("transfer", 4 * BS)
    assert dec.tokens == want


def test_a_load_past_its_deadline_is_abandoned(model):
    store = MemoryStore()
    prompt = tokens(260, seed=7)
    run(engine(model, Role.PREFILL, store), prompt)
    store.gate = threading.Event()  # the link hangs
    decode = engine(model, Role.DECODE, store, load_deadline_s=0.2)
    streamed: list[int] = []
    gen = decode.generate(GenerationRequest("r", prompt, 8, 256), streamed.append)
    assert gen.metrics.fallback == "deadline" and gen.metrics.cached_tokens == 0
    assert gen.tokens == run(engine(model, Role.COLOCATED), prompt, 8).tokens
    # The abandoned blocks stay allocated until the transfer ends, so late bytes land nowhere live.
    assert decode.cache.num_free < decode.cache.shape.num_blocks
    store.gate.set()
    decode.close()  # waits for the transfer
    decode.cache.check_invariants()
    assert decode.cache.num_free == decode.cache.shape.num_blocks


def test_an_unreachable_store_is_a_fallback_not_an_error(model, cluster):
    proc, address = cluster.serve("64MiB")
    with KVClient(address, ClientConfig(timeout_s=2.0)) as kv:
        prefill, decode = engine(model, Role.PREFILL, kv, tenant="down"), engine(model, Role.DECODE, kv, tenant="down")
        prompt = tokens(100, seed=8)
        want = run(engine(model, Role.COLOCATED), prompt).tokens
        pre, dec = pd(prefill, decode, prompt)
        assert dec.tokens == want and dec.metrics.fallback is None
        assert (pre.metrics.kv_lookup_failed, pre.metrics.kv_save_failed) == (False, False)
        assert (dec.metrics.kv_lookup_failed, dec.metrics.kv_missing_tokens) == (False, 0)
        proc.kill()
        pre, dec = pd(prefill, decode, prompt)
        assert pre.kv_transfer_params["save_error"] and pre.kv_transfer_params["cached_tokens"] == 0
        assert (pre.metrics.kv_lookup_failed, pre.metrics.kv_save_failed) == (True, True)
        assert dec.tokens == want and dec.metrics.fallback == "unavailable"
        assert (dec.metrics.kv_lookup_failed, dec.metrics.kv_missing_tokens, dec.metrics.cached_tokens) == (True, 96, 0)


def test_an_engine_tells_the_router_how_many_replicas_its_blocks_have(model, store_address):
    """The router's transfer estimate reads each block from its fastest replica (telemetry.py):
    it learns the replica count from the instances' /kvstore/info."""
    assert engine(model, Role.DECODE).info()["kv_replicas"] == 1
    with KVClient(store_address, ClientConfig(replica_num=2)) as kv:
        assert engine(model, Role.DECODE, kv).info()["kv_replicas"] == 2
