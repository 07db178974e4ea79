"""MLA stored once: SGLang's MLA latent KV (and its indexer) is the same on every TP rank, so
kvstore keys it without the rank, only the writer rank stores it, and every rank reads it. Mamba
state stays per rank."""

from __future__ import annotations

import types

import torch

from kvstore.engines.sglang.naming import Placement, StoredPool
from tests.cluster import ADMIN_TOKEN
from tests.vllm.test_sglang_backend import HostPool, _backend, sglang  # noqa: F401  (fixture)
from tests.vllm.test_sglang_v2 import PagePool, _names, _transfer


def _cfg(tp_rank, mla=True, **kw):
    return types.SimpleNamespace(tp_rank=tp_rank, tp_size=2, is_mla_model=mla, **kw)


def test_replicated_pools_are_keyed_without_the_rank():
    r0, r1 = Placement.of(_cfg(0)), Placement.of(_cfg(1))
    assert r0.shard("kv") == r1.shard("kv") == "mla" and r0.shard("indexer") == r1.shard("indexer")
    assert (r0.shard("mamba"), r1.shard("mamba")) == ("tp0of2", "tp1of2")  # state is per rank
    assert (r0.writes("kv"), r1.writes("kv"), r1.writes("mamba")) == (True, False, True)
    m0, m1 = Placement.of(_cfg(0, mla=False)), Placement.of(_cfg(1, mla=False))
    assert m0.shard("kv") != m1.shard("kv") and m1.writes("kv")
    d1 = Placement.of(_cfg(1, dcp_rank=1, dcp_size=2))
    assert d1.shard("kv") == "mla-dcp1of2" and d1.writer  # each DCP shard has its own writer
    pp = Placement.of(_cfg(1, pp_rank=1, pp_size=2))
    assert pp.shard("kv") == "mla-pp1of2"


def test_both_ranks_name_an_mla_page_alike():
    pool = PagePool(widths=(4 * 64,), dtype=torch.bfloat16)
    keys = [StoredPool.of("kv", pool, Placement.of(_cfg(r)), "org/m", "default").keys(["h"]) for r in (0, 1)]
    assert keys[0] == keys[1]
    mha = [StoredPool.of("kv", pool, Placement.of(_cfg(r, mla=False)), "org/m", "default").keys(["h"]) for r in (0, 1)]
    assert mha[0] != mha[1]


def _stored(meta):
    """(objects, bytes) the store holds (bytes in its allocation units)."""
    import os

    from kvstore.client import KVClient

    os.environ.setdefault("KVSTORE_TOKEN", ADMIN_TOKEN)
    with KVClient(meta) as client:
        stats = client.stats()
        return stats.keys, stats.used


def _write_from_both_ranks(sglang, meta, mla, model):  # noqa: F811
    """TP=2: each rank offers the same MLA pages; rank 1 then reads them into an empty pool."""
    pools = [PagePool(widths=(4 * 64,), dtype=torch.bfloat16) for _ in range(2)]
    pools[0].kv_buffer.normal_()
    pools[1].kv_buffer.copy_(pools[0].kv_buffer)  # MLA: the same latent KV on every rank
    ranks = [
        _backend(sglang, meta, pool, tp_rank=r, fields={"is_mla_model": mla, "model_name": model})
        for r, pool in enumerate(pools)
    ]
    pages = ["m0", "m1", "m2", "m3"]
    before = _stored(meta)
    assert [r.batch_set_v1(pages, torch.arange(0, 64)) for r in ranks] == [[True] * 4] * 2
    stored = tuple(after - b for after, b in zip(_stored(meta), before))
    reader = PagePool(widths=(4 * 64,), dtype=torch.bfloat16)
    fresh = _backend(sglang, meta, reader, tp_rank=1, fields={"is_mla_model": mla, "model_name": model})
    assert fresh.batch_exists(pages) == 4 and fresh.batch_get_v1(pages, torch.arange(0, 64)) == [True] * 4
    assert torch.equal(reader.kv_buffer, pools[0].kv_buffer)
    for r in [*ranks, fresh]:
        r.close()
    return stored, ranks[1].get_stats()["set_skipped"]


def test_tp2_mla_pages_are_stored_once(sglang, cluster):  # noqa: F811
    _, meta = cluster.serve("64MiB")
    per_rank, skipped_mha = _write_from_both_ranks(sglang, meta, mla=False, model="org/keyed-by-rank")
    once, skipped_mla = _write_from_both_ranks(sglang, meta, mla=True, model="org/mla")
    assert per_rank[0] == 2 * 4 and once[0] == 4  # objects: one per page and rank, then one per page
    assert per_rank[1] == 2 * once[1] > 0  # bytes halved
    assert (skipped_mha, skipped_mla) == (0, 4)  # rank 1 left its MLA pages to rank 0


def test_mamba_state_stays_per_rank_in_an_mla_model(sglang, cluster):  # noqa: F811
    _, real = sglang
    indexer, mamba, _, trailing = _names(real)
    _, meta = cluster.serve("64MiB")
    ranks = []
    for r in (0, 1):
        store = _backend(sglang, meta, PagePool(widths=(64,)), tp_rank=r, fields={"is_mla_model": True})
        state = PagePool(widths=(32, 8), dtype=torch.float32)
        state.buffers[0].fill_(r + 1)
        store.register_mem_host_pool_v2(state, mamba)
        store.register_mem_host_pool_v2(PagePool(widths=(16,), dtype=torch.uint8), indexer)
        ranks.append((store, state))
    (r0, _), (r1, s1) = ranks
    assert r0.batch_set_v2([_transfer(real, mamba, ["p0"], torch.arange(0, 16))]) == {mamba: [True]}
    need = [_transfer(real, mamba, ["p0"], policy=trailing)]
    assert r0.batch_set_v1(["p0"], torch.arange(0, 16)) == [True]
    assert r1.batch_exists_v2(["p0"], need).kv_hit_pages == 0  # rank 1's own state is not stored yet
    assert r1.batch_set_v2([_transfer(real, mamba, ["p0"], torch.arange(0, 16))]) == {mamba: [True]}
    assert r1.batch_exists_v2(["p0"], need).kv_hit_pages == 1
    s1.buffers[0].zero_()
    assert r1.batch_get_v2([_transfer(real, mamba, ["p0"], torch.arange(0, 16))]) == {mamba: [True]}
    assert bool((s1.buffers[0][:16] == 2).all())  # its own state, not rank 0's
    assert r1.batch_set_v2([_transfer(real, indexer, ["p0"], torch.arange(0, 16))]) == {indexer: [True]}
    assert r1.get_stats()["set_skipped"] == 1  # the replicated indexer is rank 0's to write
    r0.close(), r1.close()


def test_dcp_shards_of_mla_never_share_pages(sglang, cluster):  # noqa: F811
    """Under decode context parallelism each DCP rank holds its own slice of every MLA page."""
    _, meta = cluster.serve("64MiB")
    dcp = {"is_mla_model": True, "dcp_size": 2, "logical_page_size": 32}
    a = _backend(sglang, meta, HostPool(), tp_rank=0, fields={**dcp, "dcp_rank": 0})
    b = _backend(sglang, meta, HostPool(), tp_rank=1, fields={**dcp, "dcp_rank": 1})
    assert a.batch_set_v1(["k1"], torch.arange(0, 16)) == [True]
    assert b.batch_exists(["k1"]) == 0
    a.close(), b.close()
