"""Continuous batching in the reference engine: many requests in one running batch, prompts in
chunks beside decodes, preemption when the cache is full, decode KV saved back for the next turn;
every request's tokens those of the request served alone."""

import random

import pytest
import torch

from kvstore.client import KVClient
from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.reference.engine import EngineConfig, GenerationRequest, ReferenceEngine, Role
from kvstore.engines.reference.model import ModelConfig, ReferenceModel
from kvstore.engines.reference.paged_cache import CacheShape, PagedKVCache
from kvstore.engines.reference.scheduler import Scheduler, SchedulerConfig
from kvstore.engines.reference.sequence import GenerationRequest as Request
from kvstore.engines.reference.sequence import Sequence, Status

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


def engine(model, role=Role.COLOCATED, store=None, blocks=256, tenant="default", **batching) -> ReferenceEngine:
    return ReferenceEngine(
        model,
        EngineConfig(role, block_size=BS, cache_blocks=blocks, tenant=tenant, batching=SchedulerConfig(**batching)),
        store,
    )


class Sink:
    def __init__(self):
        self.tokens, self.generation, self.error = [], None, None

    def token(self, t):
        self.tokens.append(t)

    def done(self, g):
        self.generation = g

    def failed(self, e):
        self.error = e


def serve_together(e: ReferenceEngine, requests, arrive_at=None):
    """Submit each request at its step (all at once by default); step until all are done.
    Returns the sinks and every step's stats."""
    arrive_at = arrive_at or [0] * len(requests)
    sinks = [Sink() for _ in requests]
    stats, step = [], 0
    while step <= max(arrive_at) or e.has_work():
        for i, at in enumerate(arrive_at):
            if at == step:
                e.submit(requests[i], sinks[i])
        stats.append(e.step(wait_s=0.05))
        e.scheduler.check_invariants()
        e.cache.check_invariants()
        step += 1
    assert all(s.error is None and s.generation for s in sinks)
    assert all(s.generation is not None and s.tokens == s.generation.tokens for s in sinks)
    assert e.cache.num_free == e.cache.shape.num_blocks
    return sinks, [s for s in stats if s]


def alone(model, prompt, max_tokens, role=Role.COLOCATED) -> list[int]:
    return (
        engine(model, role, max_num_seqs=1)
        .generate(GenerationRequest("alone", prompt, max_tokens), lambda t: None)
        .tokens
    )


def mixed_requests(n: int, seed: int) -> list[GenerationRequest]:
    rng = random.Random(seed)
    return [
        GenerationRequest(f"r{i}", tokens(rng.choice([5, 40, 130, 300]), seed * 100 + i), rng.randint(1, 24))
        for i in range(n)
    ]


def test_a_batch_gives_each_request_its_tokens_served_alone(model):
    requests = mixed_requests(8, seed=1)
    sinks, stats = serve_together(engine(model, max_batch_tokens=64), requests, arrive_at=[0, 0, 1, 3, 3, 6, 9, 20])
    for req, sink in zip(requests, sinks):
        assert sink.tokens == alone(model, req.prompt, req.max_tokens), req.request_id
    assert max(s.sequences for s in stats) >= 4  # really batched
    assert any(s.decodes and s.prefill_tokens for s in stats)  # decodes beside prompt chunks
    assert all(s.decodes + s.prefill_tokens <= 64 for s in stats)  # within the token budget
    shared = sum(s.generation.metrics.decode_steps_with_prefill for s in sinks)
    assert 0 < shared <= sum(s.generation.metrics.decode_steps for s in sinks)


def test_without_chunking_a_prompt_is_computed_whole(model):
    requests = [*mixed_requests(4, seed=2), GenerationRequest("long", tokens(300, 9), 4)]
    sinks, stats = serve_together(engine(model, max_batch_tokens=64, chunked_prefill=False), requests)
    for req, sink in zip(requests, sinks):
        assert sink.tokens == alone(model, req.prompt, req.max_tokens)
    assert max(s.prefill_tokens for s in stats) >= 300  # one prompt, whole, in one step


def test_a_full_cache_preempts_and_recomputes_with_the_same_tokens(model):
    requests = [GenerationRequest(f"p{i}", tokens(70, 30 + i), 40) for i in range(4)]
    sinks, _ = serve_together(engine(model, blocks=20, max_batch_tokens=128), requests)  # 7 blocks each
    assert sum(s.generation.metrics.preemptions for s in sinks) > 0
    for req, sink in zip(requests, sinks):
        assert sink.tokens == alone(model, req.prompt, req.max_tokens)


def test_decode_batches_from_transferred_kv_match(model, store_address):
    requests = mixed_requests(6, seed=3)
    with KVClient(store_address) as kv:
        prefill = engine(model, Role.PREFILL, kv, max_batch_tokens=128)
        pre, _ = serve_together(prefill, requests)
        handed = [
            GenerationRequest(r.request_id, r.prompt, r.max_tokens, p.generation.kv_transfer_params["cached_tokens"])
            for r, p in zip(requests, pre)
        ]
        decode = engine(model, Role.DECODE, kv, max_batch_tokens=128)
        dec, _ = serve_together(decode, handed)
    for req, p, d in zip(requests, pre, dec):
        want = alone(model, req.prompt, req.max_tokens)
        assert d.tokens == want and p.tokens == want[:1]
        m = d.generation.metrics
        assert m.fallback is None and m.cached_tokens == min(len(req.prompt) // BS, (len(req.prompt) - 1) // BS) * BS


@pytest.mark.parametrize("role", [Role.COLOCATED, Role.DECODE])
def test_the_next_turn_finds_the_whole_history_in_kvstore(model, store_address, role):
    first = tokens(150, 40)
    with KVClient(store_address) as kv:
        e = engine(model, role, kv, tenant=f"turns-{role.value}")
        reply = e.generate(GenerationRequest("t1", first, 40), lambda t: None)
        history = first + reply.tokens
        second = history + tokens(20, 41)
        turn = e.generate(GenerationRequest("t2", second, 8), lambda t: None)
    assert reply.tokens == alone(model, first, 40)
    assert turn.tokens == alone(model, second, 8)
    # KV of every position the first turn computed (all but its last output token), in full blocks
    assert turn.metrics.cached_tokens == (len(history) - 1) // BS * BS
    assert turn.metrics.fallback is None


def test_without_saving_output_kv_the_next_turn_finds_only_the_prompt(model, store_address):
    first = tokens(150, 50)
    with KVClient(store_address) as kv:
        e = ReferenceEngine(
            model,
            EngineConfig(Role.COLOCATED, block_size=BS, cache_blocks=256, tenant="no-output", save_output_kv=False),
            kv,
        )
        reply = e.generate(GenerationRequest("t1", first, 40), lambda t: None)
        turn = e.generate(GenerationRequest("t2", first + reply.tokens + tokens(20, 51), 8), lambda t: None)
    assert turn.metrics.cached_tokens == len(first) // BS * BS


def test_the_scheduler_keeps_its_invariants_on_random_traffic():
    rng = random.Random(7)
    cache = PagedKVCache(CacheShape(1, 40, 4, 1, 2))
    sched = Scheduler(SchedulerConfig(max_num_seqs=5, max_batch_tokens=12), cache, 4)
    seqs: list[Sequence] = []
    for _step in range(400):
        if rng.random() < 0.3 and len(seqs) < 30:
            req = Request(f"s{len(seqs)}", [1] * rng.randint(1, 30), rng.randint(1, 20))
            # No sink: the scheduler alone generates nothing, so nothing is sent to one.
            seqs.append(Sequence(req, None, req.max_tokens, RequestMetrics(req.request_id, "x")))  # type: ignore[arg-type]
            sched.add(seqs[-1])
        batch = sched.schedule()
        assert sum(s.num_tokens for s in batch.chunks) <= 12
        assert len(sched.running) + len(sched.loading) <= 5
        assert len({id(s.seq) for s in batch.chunks}) == len(batch.chunks)
        for s in batch.chunks:
            assert len(s.seq.table) * 4 >= s.seq.num_computed + s.num_tokens
            s.seq.num_computed += s.num_tokens
            if s.seq.remaining == 0:
                s.seq.tokens.append(0)
                if s.seq.finished:
                    sched.finish(s.seq)
        sched.check_invariants()
        cache.check_invariants()
    while sched.has_work():
        for s in sched.schedule().chunks:
            s.seq.num_computed += s.num_tokens
            if s.seq.remaining == 0:
                s.seq.tokens.append(0)
                if s.seq.finished:
                    sched.finish(s.seq)
    assert all(s.status is Status.FINISHED and s.num_generated == s.max_tokens for s in seqs)
    assert cache.num_free == 40
