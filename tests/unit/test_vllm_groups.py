"""Hybrid models in the vLLM connector, without a vLLM process: which chunks a hit needs per KV cache
group, and that a chunk some group lacks is never offered as a hit (the connector's two sides over
an in-memory store, driven as vLLM drives them)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvstore.engines.vllm.groups import NULL_BLOCK, CacheGroup, GroupKind, GroupLayout, UnsupportedGroups
from tests.engines.fakes import MemoryStore

BS = 32
SLIDING = CacheGroup(0, GroupKind.SLIDING, BS, ("model.layers.0.attn", "model.layers.2.attn"), window=48)
FULL = CacheGroup(1, GroupKind.FULL, BS, ("model.layers.1.attn", "model.layers.3.attn"))
HYBRID = GroupLayout((SLIDING, FULL))


def test_a_hit_needs_every_full_chunk_and_the_window_chunks_of_sliding_groups() -> None:
    assert HYBRID.chunk_tokens == BS and HYBRID.trailing_chunks(0) == 2 and HYBRID.trailing_chunks(1) is None
    assert HYBRID.hit_chunks([True, True, False, True, True]) == 2
    # Without a full group, only each group's trailing chunks count: the longest end whose last
    # two chunks (the window's) are stored; a state group needs the last one only.
    state = CacheGroup(1, GroupKind.STATE, BS, ("model.layers.1.mixer",))
    local = GroupLayout((SLIDING, state))
    assert local.hit_chunks([False, True, True, False, True]) == 3
    assert local.hit_chunks([True, False, True, False]) == 1
    assert GroupLayout((CacheGroup(0, GroupKind.STATE, BS, ()),)).hit_chunks([False, True]) == 2


def test_chunks_span_the_lcm_of_the_group_block_sizes() -> None:
    layout = GroupLayout((CacheGroup(0, GroupKind.FULL, 16, ()), CacheGroup(1, GroupKind.SLIDING, 32, (), window=100)))
    assert layout.chunk_tokens == 32 and layout.blocks_per_chunk(0) == 2 and layout.blocks_per_chunk(1) == 1
    assert layout.trailing_chunks(1) == 4  # 99 tokens before the hit's end
    assert layout.chunk_blocks(([5, 6, 7], [9, 10]), 0, 2) == [(5, 6, 9), (7, NULL_BLOCK, 10)]
    assert layout.tag == "f16_s32w100"


def test_groups_from_vllms_kv_cache_config() -> None:
    pytest.importorskip("vllm")
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    attn: dict[str, Any] = {"block_size": BS, "num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
    mamba = MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(torch.float32,), mamba_cache_mode="align")

    def config(*specs: Any) -> Any:
        groups = [SimpleNamespace(kv_cache_spec=s, layer_names=[f"l{i}"]) for i, s in enumerate(specs)]
        return SimpleNamespace(kv_cache_groups=groups)

    layout = GroupLayout.from_kv_cache_config(
        config(SlidingWindowSpec(**attn, sliding_window=48), FullAttentionSpec(**attn), mamba)
    )
    assert [g.kind for g in layout.groups] == [GroupKind.SLIDING, GroupKind.FULL, GroupKind.STATE]
    assert layout.tag == "s32w48_f32_m64"
    assert layout.chunk_tokens == 64 and layout.groups[0].window == 48
    with pytest.raises(UnsupportedGroups):
        GroupLayout.from_kv_cache_config(
            config(FullAttentionSpec(**attn), ChunkedLocalAttentionSpec(**attn, attention_chunk_size=64))
        )
    with pytest.raises(UnsupportedGroups, match="align"):
        GroupLayout.from_kv_cache_config(
            config(FullAttentionSpec(**attn), MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(torch.float32,)))
        )


# -- the connector's sides over an in-memory store ----------------------------------------------


class Store(MemoryStore):
    def exists_many(self, keys: list[str]) -> list[bool]:
        return [k in self.objects for k in keys]


def _sides(store: Store, num_blocks: int = 16, **cfg: Any) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    pytest.importorskip("vllm")  # the sides speak vLLM's metadata classes
    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.scheduler import SchedulerSide
    from kvstore.engines.vllm.worker import WorkerSide

    config = ConnectorConfig.from_extra({"meta": "unused:1", **cfg}, "tiny-hybrid")
    # Layers of different groups share one tensor in vLLM (a block id belongs to one group at a time).
    shared = [torch.zeros(num_blocks, 2, BS, 8) for _ in range(2)]
    caches = {name: shared[i % 2] for g in HYBRID.groups for i, name in enumerate(g.layer_names)}
    worker = WorkerSide(config, BS, num_blocks, "cpu-test", client=store, groups=HYBRID)
    sched = SchedulerSide(config, BS, load=True, save=True, client=store, groups=HYBRID)
    sched.set_naming({0: worker.register(caches, config.model_id)})
    return sched, worker, caches


def _request(rid: str, tokens: list[int]) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid,
        prompt_token_ids=tokens,
        num_prompt_tokens=len(tokens),
        kv_transfer_params=None,
        lora_request=None,
        cache_salt=None,
        mm_features=[],
    )


def _step(req_id: str, tokens: int) -> SimpleNamespace:
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=req_id, num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens={req_id: tokens},
        preempted_req_ids=None,
    )


PROMPT = list(range(3, 3 + 5 * BS + 7))  # 5 full chunks below the last token


def _prefill(sched: Any, worker: Any, caches: dict[str, torch.Tensor], tables: tuple[list[int], ...]) -> None:
    req = _request("p", PROMPT)
    assert sched.num_new_matched_tokens(req, 0) == (0, False)
    for t in {id(t): t for t in caches.values()}.values():
        t.copy_(torch.randn_like(t))
    meta = sched.build_meta(_step("p", len(PROMPT)), lambda rid: tables)
    worker.end_step(meta)
    sched.finished(req)


def _load_step(sched: Any) -> Any:
    """The step after `after_alloc`: its metadata carries the load (no request computes)."""
    return sched.build_meta(SimpleNamespace(**{**vars(_step("-", 0)), "scheduled_new_reqs": []}), lambda rid: ())


def _until_loaded(worker: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not worker.finished(set())[1]:
        assert time.monotonic() < deadline, "the load never finished"
        time.sleep(0.005)


def test_a_chunk_some_group_lacks_is_never_a_hit() -> None:
    """The sliding-window group no longer holds chunk 2's block when the step saves (vLLM gave it
    back): chunk 2 is not stored for any group, so the hit ends before it even though the
    full-attention group holds chunks 0-4. (Per-group keys checked on the full group alone, or on
    the groups' last chunks alone, would offer all five.)"""
    store = Store()
    sched, worker, caches = _sides(store)
    sliding = [1, 2, NULL_BLOCK, 3, 4, 5]
    full = [6, 7, 8, 9, 10, 11]
    _prefill(sched, worker, caches, (sliding, full))
    assert sched.num_new_matched_tokens(_request("again", PROMPT), 0) == (2 * BS, True)
    assert worker.totals.data["save_blocks"] == 4 and worker.totals.data["save_failures"] == 0
    assert len([k for k in store.objects if not k.endswith("/scheme")]) == 4


def test_a_hit_loads_every_group_and_only_the_blocks_vllm_allocated() -> None:
    store = Store()
    sched, worker, caches = _sides(store)
    _prefill(sched, worker, caches, ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]))
    saved = {name: t.clone() for name, t in caches.items()}
    for t in caches.values():
        t.zero_()
    req = _request("q", PROMPT)
    assert sched.num_new_matched_tokens(req, 0) == (5 * BS, True)
    # vLLM allocated the window's blocks (chunks 3, 4) to the sliding group, the null block before.
    sched.after_alloc(req, ([NULL_BLOCK, NULL_BLOCK, NULL_BLOCK, 13, 14, 15], [1, 2, 3, 4, 5, 6]), 5 * BS)
    worker.start_loads(_load_step(sched))
    _until_loaded(worker)
    sliding, full = (caches[SLIDING.layer_names[0]], caches[FULL.layer_names[0]])
    before_s, before_f = saved[SLIDING.layer_names[0]], saved[FULL.layer_names[0]]
    assert torch.equal(sliding[13:15], before_s[4:6])  # chunks 3, 4 of the sliding group
    assert torch.equal(full[1:6], before_f[7:12])  # chunks 0-4 of the full group
    assert not sliding[NULL_BLOCK].any()  # the null block is never written
    assert worker.failed_loads() == set()


def test_a_chunk_gone_before_its_load_fails_the_request_not_blocks() -> None:
    """vLLM takes a multi-group load failure only by request (block ids are per group)."""
    store = Store()
    sched, worker, caches = _sides(store)
    _prefill(sched, worker, caches, ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]))
    req = _request("q", PROMPT)
    assert sched.num_new_matched_tokens(req, 0) == (5 * BS, True)
    chunk_keys = sorted((k for k in store.objects if not k.endswith("/scheme")), key=len)
    store.fail_keys = set(chunk_keys[:1])
    sched.after_alloc(req, ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]), 5 * BS)
    worker.start_loads(_load_step(sched))
    _until_loaded(worker)
    assert worker.failed_loads() == {"q"} and worker.load_errors() == set()
    sched.failed_loads({"q"})
    assert sched.num_new_matched_tokens(req, 0) == (0, False)  # never offered again


def test_hybrid_models_refuse_sync_loads_and_async_saves() -> None:
    pytest.importorskip("vllm")
    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.connector import _check_hybrid
    from kvstore.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="load_async"):
        _check_hybrid(ConnectorConfig.from_extra({"meta": "m:1", "load_async": False}, "m"), HYBRID)
    with pytest.raises(InvalidArgument, match="save_async"):
        _check_hybrid(ConnectorConfig.from_extra({"meta": "m:1", "save_async": True}, "m"), HYBRID)
