"""SGLang's storage interface v2 (several host pools per page) against a real kvstore.

The host pools are small CPU pools with the storage side of SGLang's HostKVCache
(`page_size`, `dtype`, `layout`, `get_page_buffer_meta`): SGLang's own pool classes import only
with triton and a torchvision that breaks transformers on this CPU build (see docs/sglang.md).
SGLang's PoolTransfer, PoolTransferResult, HiCacheStorageConfig and its dynamic backend factory
are its own, from the unpacked wheel, where it is there.
"""

from __future__ import annotations

import torch

from tests.vllm.test_sglang_backend import HostPool, _backend, _config, sglang  # noqa: F401  (fixture)


class PagePool:
    """A page_first host pool of one or more buffers [tokens, width] (an indexer: one buffer;
    Mamba state: temporal and conv buffers of different widths): per page, one region per buffer."""

    def __init__(self, widths=(24,), tokens=64, page_size=16, dtype=torch.float16):
        self.page_size, self.dtype, self.layout, self.size = page_size, dtype, "page_first", tokens
        self.buffers = [torch.zeros(tokens, w, dtype=dtype) for w in widths]
        self.kv_buffer = self.buffers[0]

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for start in indices.tolist()[:: self.page_size]:
            for buf in self.buffers:
                ptrs.append(buf[start].data_ptr())
                sizes.append(buf[start : start + self.page_size].numel() * buf.element_size())
        return ptrs, sizes

    def pages(self, start, count):
        return [b[start : start + count * self.page_size] for b in self.buffers]


def _names(real):
    if real is None:
        return "indexer", "mamba", "all_pages", "trailing_pages"
    return real.PoolName.INDEXER, real.PoolName.MAMBA, real.PoolHitPolicy.ALL_PAGES, real.PoolHitPolicy.TRAILING_PAGES


def _transfer(real, name, keys, host_indices=None, policy=None):
    if real is None:
        import types

        return types.SimpleNamespace(name=name, keys=keys, host_indices=host_indices, hit_policy=policy or "all_pages")
    kw = {"hit_policy": policy} if policy is not None else {}
    return real.PoolTransfer(name=name, keys=keys, host_indices=host_indices, **kw)


def _hybrid(sglang, meta, **kw):  # noqa: F811
    """A backend with a KV anchor, an indexer pool and a Mamba state pool (as SGLang registers them)."""
    _, real = sglang
    indexer, mamba, _, _ = _names(real)
    kv, idx, state = (
        HostPool(),
        PagePool(widths=(24,), dtype=torch.uint8),
        PagePool(widths=(40, 8), dtype=torch.float32),
    )
    store = _backend(sglang, meta, kv, **kw)
    store.register_mem_host_pool_v2(idx, indexer)
    store.register_mem_host_pool_v2(state, mamba)
    store.on_host_pools_registered()
    return store, kv, idx, state


def test_v2_round_trip_over_every_pool(sglang, cluster):  # noqa: F811
    _, real = sglang
    indexer, mamba, all_pages, trailing = _names(real)
    _, meta = cluster.serve("64MiB")
    a, kv, idx, state = _hybrid(sglang, meta)
    for t in [kv.kv_buffer, *idx.buffers, *state.buffers]:
        t.copy_(torch.randint(0, 100, t.shape).to(t.dtype))
    pages = ["h0", "h1", "h2"]
    assert a.batch_set_v1(pages, torch.arange(0, 48)) == [True] * 3
    stored = a.batch_set_v2(
        [_transfer(real, indexer, pages, torch.arange(0, 48)), _transfer(real, mamba, pages[2:], torch.arange(48, 64))]
    )
    assert stored == {indexer: [True] * 3, mamba: [True]}

    b, kv2, idx2, state2 = _hybrid(sglang, meta)
    needs = [_transfer(real, indexer, pages, policy=all_pages), _transfer(real, mamba, pages[-1:], policy=trailing)]
    hit = b.batch_exists_v2([*pages, "h3"], needs)
    assert real is None or isinstance(hit, real.PoolTransferResult)
    assert (hit.kv_hit_pages, hit.restorable_prefix_pages) == (3, [3])  # state only at the end of h2
    assert {str(k): v for k, v in hit.extra_pool_hit_pages.items()} == {"kv": 3, "indexer": 3, "mamba": 3}
    assert b.batch_get_v1(pages, torch.arange(16, 64)) == [True] * 3
    got = b.batch_get_v2(
        [_transfer(real, indexer, pages, torch.arange(16, 64)), _transfer(real, mamba, pages[2:], torch.arange(0, 16))]
    )
    assert got == {indexer: [True] * 3, mamba: [True]}
    assert torch.equal(kv2.kv_buffer[:, 16:64], kv.kv_buffer[:, 0:48])
    assert torch.equal(idx2.buffers[0][16:64], idx.buffers[0][0:48])
    assert all(torch.equal(x, y) for x, y in zip(state2.pages(0, 1), state.pages(48, 1)))
    a.close(), b.close()


def test_a_page_whose_pools_are_not_all_stored_is_no_hit(sglang, cluster):  # noqa: F811
    _, real = sglang
    indexer, mamba, all_pages, trailing = _names(real)
    _, meta = cluster.serve("64MiB")
    store, *_ = _hybrid(sglang, meta)
    pages = ["a0", "a1", "a2", "a3"]
    assert store.batch_set_v1(pages, torch.arange(0, 64)) == [True] * 4
    store.batch_set_v2([_transfer(real, indexer, pages[:2], torch.arange(0, 32))])  # the indexer has a0, a1
    store.batch_set_v2(
        [_transfer(real, mamba, ["a0"], torch.arange(0, 16)), _transfer(real, mamba, ["a3"], torch.arange(16, 32))]
    )
    only_kv = store.batch_exists_v2(pages, [])
    assert only_kv.kv_hit_pages == 4
    with_indexer = store.batch_exists_v2(pages, [_transfer(real, indexer, pages, policy=all_pages)])
    assert (with_indexer.kv_hit_pages, with_indexer.restorable_prefix_pages) == (2, [1, 2])
    with_state = store.batch_exists_v2(pages, [_transfer(real, mamba, ["a3"], policy=trailing)])
    assert with_state.restorable_prefix_pages == [1, 4]  # state kept at the ends of a0 and a3
    both = store.batch_exists_v2(
        pages, [_transfer(real, indexer, pages, policy=all_pages), _transfer(real, mamba, ["a3"], policy=trailing)]
    )
    assert (both.kv_hit_pages, both.restorable_prefix_pages) == (1, [1])
    unknown = store.batch_exists_v2(pages, [_transfer(real, "never_registered", pages)])
    assert unknown.kv_hit_pages == 0
    store.close()


def test_bad_transfers_and_a_dead_store_are_misses_not_errors(sglang, cluster):  # noqa: F811
    _, real = sglang
    indexer, _, _, _ = _names(real)
    proc, meta = cluster.serve("64MiB")
    store, *_ = _hybrid(sglang, meta, timeout_s=1.0)
    assert store.batch_get_v2([_transfer(real, indexer, ["x0", "x1"], torch.arange(0, 16))]) == {
        indexer: [False, False]
    }
    assert store.batch_get_v2([_transfer(real, "nope", ["x0"], torch.arange(0, 16))]) == {"nope": [False]}
    proc.kill()
    assert store.batch_exists_v2(["x0"], [_transfer(real, indexer, ["x0"])]).kv_hit_pages == 0
    assert store.batch_set_v2([_transfer(real, indexer, ["x0"], torch.arange(0, 16))]) == {indexer: [False]}
    store.close()


def test_dynamic_factory_builds_the_backend_from_extra_config(sglang, cluster):  # noqa: F811
    backend_mod, real = sglang
    if real is None:
        import pytest

        pytest.skip("SGLang's wheel is not unpacked (scripts/install_vllm.sh)")
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    _, meta = cluster.serve("64MiB")
    config = _config(meta, tenant="team-a", timeout_s=3.0)
    store = StorageBackendFactory.create_backend("dynamic", config, HostPool())
    assert type(store) is backend_mod.KVStoreHiCacheStorage and isinstance(store, real.HiCacheStorage)
    assert store.zero_copy and store.client.config.timeout_s == 3.0
    store.register_mem_pool_host(HostPool())
    assert store._kv.scheme.tenant == "team-a" and store._kv.scheme.model == "org/tiny-model"
    store.close()
