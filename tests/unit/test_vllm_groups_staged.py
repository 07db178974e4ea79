"""The staged path (CUDA caches, hybrid chunks) on its host stand-in: a CPU cache moved through
separate host staging rows exactly as a CUDA cache is, minus the streams. It must store the very
keys and bytes the in-place path stores, so instances on either path share KV."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from kvstore.engines.vllm.device_copies import DeviceCopies, GatherPart, ScatterPart
from kvstore.engines.vllm.groups import NULL_BLOCK
from tests.engines.fakes import MemoryStore
from tests.unit.test_vllm_groups import PROMPT, Store, _load_step, _request, _step

BS = 32
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def test_stand_in_copies_round_trip_through_a_separate_host_buffer() -> None:
    plane = torch.randn(8, 2, 4, 4)
    copies = DeviceCopies(torch.device("cpu"), stand_in=True)
    ids = torch.tensor([5, 2])
    staged = copies.gather([GatherPart(plane, ids, 0, 128)], 2, 128)
    assert staged.device_rows is not None and staged.host.data_ptr() != staged.device_rows.data_ptr()
    staged.wait()
    assert torch.equal(staged.host[0].view(torch.float32).reshape(2, 4, 4), plane[5])
    target = torch.zeros_like(plane)
    copies.scatter(staged.host, [ScatterPart(target, torch.tensor([1]), torch.tensor([7]), 0, 128)])
    assert torch.equal(target[7], plane[2]) and not target[:7].any()


def _single(
    store: MemoryStore, staged: bool, granularity: str = "layer", device: str = "cpu"
) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    pytest.importorskip("vllm")
    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.scheduler import SchedulerSide
    from kvstore.engines.vllm.worker import WorkerSide

    config = ConnectorConfig.from_extra(
        {"meta": "unused:1", "stage_host_caches": staged, "granularity": granularity}, "tiny"
    )
    torch.manual_seed(0)
    caches = {name: torch.randn(16, 2, BS, 8).to(device) for name in LAYERS}
    worker = WorkerSide(config, BS, 16, "cpu-test", client=store)
    sched = SchedulerSide(config, BS, load=True, save=True, client=store)
    sched.set_naming({0: worker.register(caches, config.model_id)})
    return sched, worker, caches


def _prefill_by_layer(sched: Any, worker: Any, caches: dict[str, torch.Tensor], table: list[int]) -> None:
    req = _request("p", PROMPT)
    sched.num_new_matched_tokens(req, 0)
    meta = sched.build_meta(_step("p", len(PROMPT)), lambda rid: table)
    for name in caches:  # as vLLM calls save_kv_layer after each layer's attention
        worker.save_layer(meta, name)
    worker.end_step(meta)
    sched.finished(req)


DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu, id="cuda"), pytest.param("cpu", id="host-stand-in")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("granularity", ["layer", "block"])
def test_staged_saves_store_the_in_place_paths_keys_and_bytes(granularity: str, device: str) -> None:
    """A CUDA cache (or its host stand-in) stores what a CPU cache read in place stores."""
    table = [3, 4, 5, 6, 7, 8]
    in_place, staged = MemoryStore(), MemoryStore()
    _prefill_by_layer(*_single(in_place, False, granularity), table)
    sched, worker, caches = _single(staged, device == "cpu", granularity, device)
    _prefill_by_layer(sched, worker, caches, table)
    assert worker.totals.data["save_failures"] == 0 and len(in_place.objects) > 1
    assert staged.objects == in_place.objects

    # ...and a staged load puts those bytes back into other blocks.
    saved = {n: t.clone() for n, t in caches.items()}
    for t in caches.values():
        t.zero_()
    req = _request("q", PROMPT)
    assert sched.num_new_matched_tokens(req, 0) == (5 * BS, True)
    sched.after_alloc(req, [9, 10, 11, 12, 13, 14], 5 * BS)
    worker.start_loads(_load_step(sched))
    _until_loaded(worker)
    for name, t in caches.items():
        assert torch.equal(t[9:14], saved[name][3:8]) and not t[:9].any()


def test_hybrid_chunks_are_the_same_objects_staged_or_not() -> None:
    from tests.unit.test_vllm_groups import _prefill, _sides

    tables = ([1, 2, NULL_BLOCK, 3, 4, 5], [6, 7, 8, 9, 10, 11])
    plain, staged = Store(), Store()
    torch.manual_seed(1)
    _prefill(*_sides(plain), tables)
    torch.manual_seed(1)
    _prefill(*_sides(staged, stage_host_caches=True), tables)
    assert len(plain.objects) == 5 and staged.objects == plain.objects  # 4 chunks and the scheme


def _until_loaded(worker: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not worker.finished(set())[1]:
        assert time.monotonic() < deadline, "the load never finished"
        time.sleep(0.005)


def test_caches_on_other_devices_are_refused() -> None:
    pytest.importorskip("vllm")
    from kvstore.engines.vllm.worker import UnsupportedCache, cache_planes

    with pytest.raises(UnsupportedCache, match="CPU and CUDA"):
        cache_planes({"a": torch.zeros(8, 2, 4, device="meta")}, 8)
