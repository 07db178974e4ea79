"""MLA stored once: every TP rank of an MLA model holds the same latent KV, so ranks that vLLM
reports as replicas (`kv_tp_replicas`) name their blocks alike, rank 0 stores them and every rank
loads them. Two worker sides play TP ranks 0 and 1 of one instance against one real store."""

from __future__ import annotations

import pytest
import torch

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.engines.keys import Shard
from kvstore.errors import InvalidArgument
from tests.vllm.conftest import needs_vllm
from tests.vllm.test_connector_sides import BS, _request, _step, _until_finished

LAYERS = 3
NUM_BLOCKS = 16
LATENT = 72  # DeepSeek's is 512 + 64 (kv_lora_rank + rope dim); the shape is what matters
PROMPT = list(range(500, 500 + 4 * BS + 5))  # 4 full blocks


def test_shard_tags_name_replicas_alike_and_only_the_first_writes():
    plain = [Shard(r, 2) for r in range(2)]
    assert [s.tag for s in plain] == ["tp0of2-pp0of1", "tp1of2-pp0of1"]  # unchanged keys
    assert all(s.writes for s in plain)
    mla = [Shard(r, 2, tp_replicas=2) for r in range(2)]
    assert {s.tag for s in mla} == {"tp0of1r2-pp0of1"} != {Shard().tag}  # not TP=1's keys either
    assert [s.writes for s in mla] == [True, False]
    gqa = [Shard(r, 4, tp_replicas=2) for r in range(4)]  # 2 KV heads over 4 ranks
    assert [s.tag[:6] for s in gqa] == ["tp0of2", "tp0of2", "tp1of2", "tp1of2"]
    assert [s.writes for s in gqa] == [True, False, True, False]
    for bad in ({"tp_rank": 2, "tp_size": 2}, {"tp_size": 4, "tp_replicas": 3}, {"tp_replicas": 0}):
        with pytest.raises(InvalidArgument):
            Shard(**bad)


def _ranks(meta: str, replicated: bool):
    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.scheduler import SchedulerSide
    from kvstore.engines.vllm.worker import WorkerSide

    config = ConnectorConfig.from_extra({"meta": meta, "granularity": "layer"}, "tiny-mla")
    torch.manual_seed(1)
    latent = [torch.randn(NUM_BLOCKS, BS, LATENT) for _ in range(LAYERS)]  # one MLA cache...
    workers, caches = [], []
    for rank in range(2):
        shard = Shard(rank, 2, tp_replicas=2 if replicated else 1)
        worker = WorkerSide(config, BS, NUM_BLOCKS, f"cpu-test-{shard.tag}", shard=shard)
        cache = {f"model.layers.{i}.self_attn.attn": latent[i].clone() for i in range(LAYERS)}  # ...on each rank
        workers.append((worker, worker.register(cache, config.model_id)))
        caches.append(cache)
    sched = SchedulerSide(config, BS, load=True, save=True)
    sched.set_naming({rank: handshake for rank, (_, handshake) in enumerate(workers)})
    return sched, [w for w, _ in workers], caches


def _stored(client: KVClient, namespace_part: str) -> tuple[int, int]:
    """(objects, bytes) of the blocks stored under layouts naming `namespace_part`."""
    keys = [k for k in client.iter_keys("default/tiny-mla/") if namespace_part in k and not k.endswith("/scheme")]
    return len(keys), sum(info.size for info in client.describe(keys))


def _prefill_on_both_ranks(sched, workers, table: list[int]) -> None:
    req = _request("p", PROMPT)
    assert sched.num_new_matched_tokens(req, 0) == (0, False)
    meta = sched.build_meta(_step([("p", 0)], {"p": len(PROMPT)}), lambda rid: table)
    for worker in workers:  # each rank runs the same step on its own copy of the latent cache
        for i in range(LAYERS):
            worker.save_layer(meta, f"model.layers.{i}.self_attn.attn")
        worker.end_step(meta)
    assert sched.finished(req)[1]["kvstore_blocks"] == 4


@needs_vllm
def test_a_tp2_mla_instance_stores_half_the_bytes_and_both_ranks_load_them(cluster):
    _, meta = cluster.serve("64MiB")
    client = KVClient(meta, ClientConfig())
    table = [1, 2, 3, 4, 5]
    sched, workers, _ = _ranks(meta, replicated=False)  # before: every rank keys its own copy
    _prefill_on_both_ranks(sched, workers, table)
    before = _stored(client, "-tp")
    for w in workers:
        w.close()
    sched.close()

    sched, workers, caches = _ranks(meta, replicated=True)
    _prefill_on_both_ranks(sched, workers, table)
    after = _stored(client, "r2-pp0of1")
    block_bytes = BS * LATENT * 4
    assert before == (2 * 4 * LAYERS, 2 * 4 * LAYERS * block_bytes)
    assert after == (4 * LAYERS, 4 * LAYERS * block_bytes)  # half the objects, half the bytes
    assert workers[0].totals.data["save_blocks"] == 4 and workers[1].totals.data["save_blocks"] == 0

    # A second instance (both ranks) finds the prefix and each rank loads rank 0's single copy.
    sched2, workers2, caches2 = _ranks(meta, replicated=True)
    for cache in caches2:
        for t in cache.values():
            t.zero_()
    req = _request("d", PROMPT)
    assert sched2.num_new_matched_tokens(req, 0) == (4 * BS, True)
    sched2.after_alloc(req, [9, 10, 11, 12, 13], 4 * BS)
    load = sched2.build_meta(_step(), lambda rid: [])
    for worker in workers2:
        worker.start_loads(load)
        assert _until_finished(worker) == {"d"}
        assert worker.load_errors() == set()
    for cache in caches2:
        for name, t in cache.items():
            assert torch.equal(t[[9, 10, 11, 12]], caches[0][name][table[:4]])
    for w in workers + workers2:
        w.close()
    sched.close()
    sched2.close()
    client.close()
