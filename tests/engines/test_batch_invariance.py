"""The reference model's numbers for a sequence are the same bits whatever else is in its batch and
however its prompt is cut into chunks: what continuous batching, chunked prefill, preemption and
KV from another instance rely on to give the tokens of a request served alone."""

import random

import pytest
import torch

from kvstore.engines.reference.model import ModelConfig, ReferenceModel, _silu
from kvstore.engines.reference.paged_cache import CacheShape, Chunk, PagedKVCache

BS = 16


@pytest.fixture(params=[(1, 2), (1, 4), (2, 2)], ids=["1thread-gqa", "1thread-mha", "2threads-gqa"])
def model(request):
    threads, kv_heads = request.param
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    yield ReferenceModel(ModelConfig(num_kv_heads=kv_heads))
    torch.set_num_threads(before)


def cache_for(model: ReferenceModel) -> PagedKVCache:
    c = model.config
    return PagedKVCache(CacheShape(c.num_layers, 256, BS, c.num_kv_heads, c.head_dim))


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(rng.randint(2, 300))] for _ in range(n)]


def serve_alone(model, prompt, cuts=(), steps=6):
    """Prefill cut at `cuts`, then `steps` greedy decode steps: (every logits row, the cache, table)."""
    cache = cache_for(model)
    table = cache.allocate(cache.shape.blocks_for(len(prompt) + steps))
    pos, rows = 0, []
    for cut in [*cuts, len(prompt)]:
        logits = model.forward_batch([Chunk(prompt[pos:cut], pos, table)], cache)[0]
        pos = cut
    rows.append(logits)
    for _ in range(steps - 1):
        rows.append(model.forward_batch([Chunk([int(rows[-1].argmax())], pos, table)], cache)[0])
        pos += 1
    return torch.stack(rows), cache, table


def kv_of(cache: PagedKVCache, table, length: int) -> list[torch.Tensor]:
    """Each layer's K and V of positions [0, length), `[length, 2, kv_heads, head_dim]`."""
    return [layer[table].transpose(1, 2).reshape(-1, 2, *layer.shape[3:])[:length] for layer in cache.layers]


def test_chunking_does_not_change_a_bit(model):
    rng = random.Random(1)
    for prompt in prompts(3, seed=2):
        want, want_cache, want_table = serve_alone(model, prompt)
        for _ in range(2):
            cuts = sorted(rng.sample(range(1, len(prompt)), min(3, len(prompt) - 1)))
            cuts[-1] = len(prompt) - 1 if rng.random() < 0.3 else cuts[-1]  # a one-token last chunk
            got, cache, table = serve_alone(model, prompt, cuts)
            assert torch.equal(got, want), cuts
            for a, b in zip(kv_of(cache, table, len(prompt)), kv_of(want_cache, want_table, len(prompt))):
                assert torch.equal(a, b), cuts


def test_batching_does_not_change_a_bit(model):
    batch = [*prompts(5, seed=3)[:4], [7] * 33]
    alone = [serve_alone(model, p)[0] for p in batch]
    cache = cache_for(model)
    tables = [cache.allocate(cache.shape.blocks_for(len(p) + 6)) for p in batch]
    # Step 1: sequences 0-2 prefill together. Then 0-2 decode while 3 and 4 prefill in chunks.
    logits = model.forward_batch([Chunk(p, 0, t) for p, t in zip(batch[:3], tables)], cache)
    rows = {i: [logits[i]] for i in range(3)}
    pos = {i: len(batch[i]) for i in range(3)} | {3: 0, 4: 0}
    for _ in range(5):
        chunks, owners = [], []
        for i in sorted(pos):
            if i in rows and len(rows[i]) < 6:
                chunks.append(Chunk([int(rows[i][-1].argmax())], pos[i], tables[i]))
            elif i not in rows:
                n = min(len(batch[i]) - pos[i], 97)
                chunks.append(Chunk(batch[i][pos[i] : pos[i] + n], pos[i], tables[i]))
            else:
                continue
            owners.append(i)
        logits = model.forward_batch(chunks, cache)
        for row, (i, chunk) in enumerate(zip(owners, chunks)):
            pos[i] += len(chunk.tokens)
            if i in rows or pos[i] == len(batch[i]):
                rows.setdefault(i, []).append(logits[row])
    for i in range(5):
        assert torch.equal(torch.stack(rows[i]), alone[i][: len(rows[i])]), i


def test_recomputing_generated_tokens_as_a_prompt_gives_the_same_bits(model):
    """Preemption by recompute, and a decode instance recomputing the tail of transferred KV."""
    prompt = prompts(1, seed=4)[0]
    want, _, _ = serve_alone(model, prompt)
    generated = [int(row.argmax()) for row in want]
    cache = cache_for(model)
    table = cache.allocate(cache.shape.blocks_for(len(prompt) + 6))
    assert torch.equal(model.forward_batch([Chunk(prompt + generated[:4], 0, table)], cache)[0], want[4])


def test_silu_is_exact_per_element_and_close_to_torch():
    x = torch.linspace(-90, 90, 200_001)
    assert (_silu(x) - torch.nn.functional.silu(x)).abs().max() < 2e-6
    rows = torch.randn(67, 688, generator=torch.Generator().manual_seed(0)) * 4
    alone = torch.cat([_silu(rows[i : i + 1]) for i in range(len(rows))])
    for n in (1, 3, 17, 35, 67):  # torch's own silu differs for odd row counts
        assert torch.equal(_silu(rows[:n]), alone[:n])
