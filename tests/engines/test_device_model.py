"""The reference model's fast forward pass (kvstore/engines/reference/device_model.py) against the
bit-exact one, on the CPU: same weights, same logits within rounding, and KV from an earlier pass
(or from another cache, as a decode instance gets it) gives the logits of one whole pass."""

import pytest
import torch

from kvstore.engines.reference.device_model import DeviceModel, llama_1b, new_planes, parameter_count
from kvstore.engines.reference.model import ModelConfig, ReferenceModel
from kvstore.engines.reference.paged_cache import CacheShape, PagedKVCache

CONFIG = ModelConfig(max_positions=1024)
BS = 16


@pytest.fixture(scope="module")
def models():
    ref = ReferenceModel(CONFIG)
    return ref, DeviceModel(ref, torch.device("cpu"))


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_same_logits_as_the_reference_forward(models):
    ref, fast = models
    tokens = prompt(200)
    cache = PagedKVCache(CacheShape(CONFIG.num_layers, 16, BS, CONFIG.num_kv_heads, CONFIG.head_dim))
    table = cache.allocate(cache.shape.blocks_for(200))
    want = ref.forward(tokens, 0, cache, table)
    planes = new_planes(CONFIG, 16, BS, torch.device("cpu"))
    got = fast.forward(tokens, 0, planes, list(range(13)))
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    for layer, plane in enumerate(planes):  # the KV it wrote is the reference's
        assert torch.allclose(plane[:13], cache.layers[layer][table], atol=1e-5)


def test_tail_after_moved_kv_gives_the_whole_pass(models):
    _, fast = models
    tokens = prompt(300, 1)
    whole = fast.forward(tokens, 0, new_planes(CONFIG, 20, BS, torch.device("cpu")), list(range(20)))
    prefill = new_planes(CONFIG, 20, BS, torch.device("cpu"))
    fast.forward(tokens, 0, prefill, list(range(20)))
    decode = new_planes(CONFIG, 40, BS, torch.device("cpu"))
    table = list(range(39, 19, -1))  # other block ids, as another instance has
    for layer in range(CONFIG.num_layers):
        decode[layer][table[:18]] = prefill[layer][:18]  # 18 full blocks arrive from the store
    tail = fast.forward(tokens[18 * BS :], 18 * BS, decode, table)
    assert torch.allclose(tail, whole, atol=1e-4, rtol=1e-4)


def test_the_1b_shape():
    c = llama_1b()
    assert 1.0e9 < parameter_count(c) < 1.2e9
    assert c.kv_bytes_per_token == 32 * 1024 and c.max_positions > 32768


@pytest.mark.gpu
def test_on_cuda_the_same_logits_as_on_the_cpu(models):
    ref, cpu = models
    cuda = DeviceModel(ref, torch.device("cuda"))
    tokens = prompt(300, 2)
    want = cpu.forward(tokens, 0, new_planes(CONFIG, 20, BS, torch.device("cpu")), list(range(20)))
    planes = new_planes(CONFIG, 20, BS, torch.device("cuda"))
    got = cuda.forward(tokens, 0, planes, list(range(20)))
    assert torch.allclose(got.cpu(), want, atol=1e-3, rtol=1e-3)
    tail = cuda.forward(tokens[288:], 288, planes, list(range(20)))  # a tail over the cached KV, masked
    assert torch.allclose(tail.cpu(), want, atol=1e-3, rtol=1e-3)
