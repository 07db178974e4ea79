"""The connector's two halves driven directly, as vLLM drives them, over a real kvstore: no engine,
so these run in seconds. (Needs vLLM importable: the halves speak vLLM's metadata classes.)"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from tests.vllm.conftest import needs_vllm

pytestmark = needs_vllm

BS = 16


def _sides(meta, dtype=torch.float32, block_size=BS, layers=2, num_blocks=32, **cfg):
    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.scheduler import SchedulerSide
    from kvstore.engines.vllm.worker import WorkerSide

    config = ConnectorConfig.from_extra({"meta": meta, **cfg}, "tiny")
    caches = {
        f"model.layers.{i}.self_attn.attn": torch.zeros(num_blocks, 2, block_size, 64, dtype=dtype)
        for i in range(layers)
    }
    worker = WorkerSide(config, block_size, num_blocks, "cpu-test-tp0of1-pp0of1")
    sched = SchedulerSide(config, block_size, load=True, save=True)
    sched.set_naming({0: worker.register(caches, config.model_id)})
    return sched, worker, caches


def _request(rid, tokens, **kw):
    return SimpleNamespace(
        **{
            "request_id": rid,
            "prompt_token_ids": tokens,
            "num_prompt_tokens": len(tokens),
            "kv_transfer_params": None,
            "lora_request": None,
            "cache_salt": None,
            "mm_features": [],
            **kw,
        }
    )


def _step(new=(), scheduled=None):
    """A SchedulerOutput with `new` = [(req_id, num_computed_tokens)] scheduled for `scheduled` tokens."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, num_computed_tokens=c) for r, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
        num_scheduled_tokens=scheduled or {},
        preempted_req_ids=None,
    )


def _until_finished(worker, finished_req_ids=(), sending=False, timeout=10.0):
    """Poll get_finished as vLLM does each step until it reports receives (or sends)."""
    deadline = time.monotonic() + timeout
    while True:
        done = worker.finished(set(finished_req_ids))[0 if sending else 1]
        if done:
            return done
        assert time.monotonic() < deadline, "timed out waiting for get_finished"
        time.sleep(0.01)


def _prefill(sched, worker, caches, req, table):
    """One step computing the whole prompt of `req` into blocks `table`, saving as vLLM would."""
    assert sched.num_new_matched_tokens(req, 0) == (0, False)
    for t in caches.values():
        t[table] = torch.randn_like(t[table])
    meta = sched.build_meta(
        _step([(req.request_id, 0)], {req.request_id: len(req.prompt_token_ids)}), lambda rid: table
    )
    for name in caches:
        worker.save_layer(meta, name)
    worker.end_step(meta)
    return meta


def test_cache_planes_follow_the_tensor_layout():
    from kvstore.engines.vllm.worker import UnsupportedCache, cache_planes

    cpu = torch.zeros(8, 2, 32, 64)  # vLLM CPU: [blocks, heads, block, 2*head]
    kv_first = torch.zeros(2, 8, 32, 2, 32)  # [2, blocks, block, heads, head]
    planes, layer_of_plane, by_name = cache_planes({"a": cpu, "b": kv_first, "c": cpu}, 8)
    assert [tuple(p.shape) for p in planes] == [(8, 2, 32, 64), (8, 32, 2, 32), (8, 32, 2, 32)]
    assert layer_of_plane == [0, 1, 1] and by_name == {"a": 0, "b": 1, "c": 0}  # "c" shares "a"
    with pytest.raises(UnsupportedCache):
        cache_planes({"a": torch.zeros(4, 8, 32)}, 8)


def test_prefill_saves_and_another_instance_loads_the_same_bytes(cluster):
    _, meta = cluster.serve("64MiB")
    sched, worker, caches = _sides(meta)
    req = _request("r1", list(range(100, 150)))  # 3 full blocks of 16, and 2 tokens
    step = _prefill(sched, worker, caches, req, [5, 6, 7, 8])
    assert [(j.req_id, j.block_ids) for j in step.saves] == [("r1", (5, 6, 7))]
    hold, params = sched.finished(req)
    assert not hold and params["kvstore_blocks"] == 3  # synchronous saves: already stored
    assert worker.totals.data["save_blocks"] == 3

    sched2, worker2, caches2 = _sides(meta)
    req2 = _request("r2", list(range(100, 150)))
    assert sched2.num_new_matched_tokens(req2, 0) == (48, True)
    assert sched2.num_new_matched_tokens(req2, 16) == (32, True)  # vLLM's own prefix hit comes first
    sched2.after_alloc(req2, [10, 11, 12, 13], 32)
    meta2 = sched2.build_meta(_step(), lambda rid: [])
    assert [(j.hashes == step.saves[0].hashes[1:], j.block_ids) for j in meta2.loads] == [(True, (11, 12))]
    worker2.start_loads(meta2)
    assert _until_finished(worker2) == {"r2"}
    for name in caches:
        assert torch.equal(caches2[name][[11, 12]], caches[name][[6, 7]])
    assert worker2.load_errors() == set()
    worker.close(), worker2.close(), sched.close(), sched2.close()


def test_async_saves_hold_blocks_until_acknowledged(cluster):
    _, meta = cluster.serve("64MiB")
    sched, worker, caches = _sides(meta, save_async=True)
    req = _request("r1", list(range(40)))
    _prefill(sched, worker, caches, req, [1, 2, 3])
    hold, params = sched.finished(req)
    assert hold and params["kvstore_blocks"] == 2
    assert worker.finished(set()) == (None, None)  # not finished in the scheduler yet
    assert _until_finished(worker, {"r1"}, sending=True) == {"r1"}
    assert sched.num_new_matched_tokens(_request("r2", list(range(40))), 0) == (32, True)
    worker.close()
    sched.close()


def test_failed_load_reports_blocks_and_is_not_retried(cluster):
    from kvstore.client import KVClient

    _, meta = cluster.serve("64MiB")
    sched, worker, caches = _sides(meta, load_async=False)
    _prefill(sched, worker, caches, _request("r1", list(range(70))), [1, 2, 3, 4, 5])
    req = _request("r2", list(range(70)))
    assert sched.num_new_matched_tokens(req, 0) == (64, False)
    sched.after_alloc(req, [20, 21, 22, 23, 24], 64)
    step = sched.build_meta(_step(), lambda rid: [])
    with KVClient(meta) as kv:  # blocks 2.. vanish between lookup and load
        keys = sched.scheme.object_keys(step.loads[0].hashes[2:], sched.parts)
        kv.remove_many(keys, force=True)
    worker.start_loads(step)
    assert worker.load_errors() == {22, 23}
    assert worker.totals.data["load_blocks"] == 2 and worker.totals.data["load_failures"] == 1
    sched.load_errors({22, 23})
    assert sched.num_new_matched_tokens(req, 0) == (0, False)
    worker.close()
    sched.close()


def test_dtype_and_block_size_give_other_keys_and_a_seed_mismatch_is_refused(cluster):
    from kvstore.engines.codec import SchemeMismatch

    _, meta = cluster.serve("64MiB")
    base = _sides(meta)
    variants = [_sides(meta, dtype=torch.bfloat16), _sides(meta, block_size=32)]
    sched, worker, caches = base
    _prefill(sched, worker, caches, _request("r", list(range(80))), [1, 2, 3, 4, 5, 6])
    namespaces = {base[0].scheme.namespace} | {v[0].scheme.namespace for v in variants}
    assert len(namespaces) == 3
    with pytest.raises(SchemeMismatch):  # same namespace, other hashes: never a silent miss
        _sides(meta, hash_seed=7)
    # all 5 blocks: after an async load vLLM recomputes only the last token itself
    assert base[0].num_new_matched_tokens(_request("again", list(range(80))), 0) == (80, True)
    for sched, _, _ in variants:
        assert sched.num_new_matched_tokens(_request("x", list(range(80))), 0) == (0, False)
    for sched, worker, _ in [base, *variants]:
        worker.close()
        sched.close()


@pytest.mark.parametrize("shared_ids", [True, False], ids=["same-blocks", "copied-blocks"])
def test_requests_sharing_a_prefix_in_one_step_store_each_block_once(cluster, shared_ids):
    """Issue 18: b reuses a's 4 prefix blocks in the step that computes them (vLLM's prefix cache:
    the same block ids) or computes its own copies (other ids, the same hashes). The step's batch
    names each key once, so it is stored, and another instance loads all 5 blocks."""
    _, meta = cluster.serve("64MiB")
    sched, worker, caches = _sides(meta)
    prefix = list(range(100, 164))
    a, b = _request("a", prefix), _request("b", prefix + list(range(7, 23)))
    tables = {"a": [1, 2, 3, 4], "b": [1, 2, 3, 4, 5] if shared_ids else [6, 7, 8, 9, 5]}
    for t in caches.values():
        t[1:10] = torch.randn_like(t[1:10])
        if not shared_ids:
            t[6:10] = t[1:5]
    assert sched.num_new_matched_tokens(a, 0) == (0, False)
    assert sched.num_new_matched_tokens(b, 64 if shared_ids else 0) == (0, False)
    step = sched.build_meta(
        _step([("a", 0), ("b", 64 if shared_ids else 0)], {"a": 64, "b": 16 if shared_ids else 80}), tables.__getitem__
    )
    assert sum(len(j.hashes) for j in step.saves) == 9  # the shared blocks, twice
    for name in caches:
        worker.save_layer(step, name)
    worker.end_step(step)
    totals = worker.totals.data
    assert (totals["save_failures"], totals["save_blocks"], totals["save_deduped"]) == (0, 5, 4)
    sched2, worker2, caches2 = _sides(meta)
    c = _request("c", b.prompt_token_ids)
    assert sched2.num_new_matched_tokens(c, 0) == (80, True)
    sched2.after_alloc(c, [20, 21, 22, 23, 24], 80)
    worker2.start_loads(sched2.build_meta(_step(), lambda rid: []))
    assert _until_finished(worker2) == {"c"}
    for name in caches:
        assert torch.equal(caches2[name][20:25], caches[name][tables["b"]])
    for side in (worker, worker2, sched, sched2):
        side.close()


class GatedClient:
    """The real client, whose put_many waits for `gate` and records the keys of every call."""

    def __init__(self, meta: str) -> None:
        from kvstore.client import KVClient

        self.client = KVClient(meta)
        self.gate = threading.Event()
        self.calls: list[list[str]] = []

    def put_many(self, keys, values):
        self.calls.append(list(keys))
        self.gate.wait(30)
        return self.client.put_many(keys, values)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_block_already_being_saved_is_not_saved_again_and_its_requests_wait_for_it(cluster):
    """Async saves: a's save is still writing the shared prefix when b's step comes; b's batch
    leaves those blocks out, and b is acknowledged only once a's save (which holds them) is done."""
    from kvstore.engines.vllm.config import ConnectorConfig
    from kvstore.engines.vllm.worker import WorkerSide

    _, meta = cluster.serve("64MiB")
    sched, plain, caches = _sides(meta, granularity="block", save_async=True)
    plain.close()
    gated = GatedClient(meta)
    worker = WorkerSide(
        ConnectorConfig.from_extra({"meta": meta, "granularity": "block", "save_async": True}, "tiny"),
        BS,
        32,
        "cpu-test-tp0of1-pp0of1",
        client=gated,
    )
    worker.register(caches, "tiny")
    prefix = list(range(200, 232))
    a, b = _request("a", prefix), _request("b", prefix + list(range(16)))
    for t in caches.values():
        t[1:4] = torch.randn_like(t[1:4])
    sched.num_new_matched_tokens(a, 0)
    first = sched.build_meta(_step([("a", 0)], {"a": 32}), lambda rid: [1, 2])
    worker.end_step(first)  # a's 2 blocks: written, gated
    sched.num_new_matched_tokens(b, 32)
    second = sched.build_meta(_step([("b", 32)], {"b": 16}), lambda rid: [1, 2, 3])
    worker.end_step(second)  # b: only its own block
    assert worker.finished({"a", "b"}) == (None, None)  # both wait for a's save
    gated.gate.set()
    acked: set[str] = set()
    while acked != {"a", "b"}:
        acked |= _until_finished(worker, sending=True)
    keys = [k for call in gated.calls for k in call if not k.endswith("/scheme")]
    assert len(keys) == len(set(keys)) == 3  # every block key written once
    assert worker.totals.data["save_deduped"] == 2 and worker.totals.data["save_failures"] == 0
    worker.close()
    sched.close()


def test_a_dead_store_is_counted_and_reported_per_request(cluster):
    """Issue 18: kill `kvstore serve` between a PD prefill and its decode, then prefill again.
    The decode does not wait for the promised blocks (kvstore cannot deliver them), counts the
    failed lookup and the recomputed tokens, and says so in its kv_transfer_params; the second
    prefill's saves fail and its answer promises nothing."""
    serve, meta = cluster.serve("64MiB")
    sched, worker, caches = _sides(meta, transfer_timeout_s=2.0)
    decode_sched, decode_worker, _ = _sides(meta)
    pd = {"do_remote_decode": True}
    first = _request("p1", list(range(300, 350)), kv_transfer_params=pd)  # 3 blocks
    _prefill(sched, worker, caches, first, [1, 2, 3, 4])
    _, handoff = sched.finished(first)
    assert handoff["kvstore_blocks"] == 3 and "kvstore_save_error" not in handoff

    serve.kill()
    dec = _request("d1", list(range(300, 350)), kv_transfer_params=handoff)
    assert decode_sched.num_new_matched_tokens(dec, 0) == (0, False)  # no waiting for the prefill
    _, report = decode_sched.finished(dec)
    assert {k: report[k] for k in ("kvstore_loaded_tokens", "kvstore_missing_tokens", "kvstore_lookup_failed")} == {
        "kvstore_loaded_tokens": 0,
        "kvstore_missing_tokens": 48,
        "kvstore_lookup_failed": True,
    }
    stats = decode_sched.take_interval_stats().data
    assert (stats["lookup_failures"], stats["recomputed_tokens"]) == (1, 48)
    again = _request("d2", list(range(300, 350)), kv_transfer_params=handoff)
    assert decode_sched.num_new_matched_tokens(again, 0) == (0, False)
    assert decode_sched.take_interval_stats().data["lookups_skipped"] == 1  # within lookup_backoff_s

    second = _request("p2", list(range(400, 450)), kv_transfer_params=pd)
    _prefill(sched, worker, caches, second, [5, 6, 7, 8])
    assert worker.totals.data["save_failures"] == 1
    _, answer = sched.finished(second)
    assert answer["kvstore_blocks"] == 0 and "unconfirmed" in answer["kvstore_save_error"]
    assert answer["kvstore_lookup_failed"] is True
    assert sched.stats["unsaved_blocks"] == 3
    for side in (worker, decode_worker, sched, decode_sched):
        side.close()


def test_a_prefill_promises_only_the_blocks_kvstore_holds(cluster):
    from kvstore.client import KVClient

    _, meta = cluster.serve("64MiB")
    sched, worker, caches = _sides(meta)
    req = _request("p", list(range(500, 570)), kv_transfer_params={"do_remote_decode": True})  # 4 blocks
    step = _prefill(sched, worker, caches, req, [1, 2, 3, 4, 5])
    with KVClient(meta) as kv:  # block 2 vanishes before the prefill ends
        kv.remove_many(sched.scheme.object_keys(step.saves[0].hashes[2:3], sched.parts), force=True)
    _, answer = sched.finished(req)
    assert answer["kvstore_blocks"] == 2 and "holds 2 of the 4 blocks" in answer["kvstore_save_error"]
    assert sched.stats["unsaved_blocks"] == 2
    worker.close()
    sched.close()
