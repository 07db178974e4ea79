"""A PD pair on vLLM's CPU build whose store dies (issue 18): `kvstore serve` is killed between a
prefill and its decode, then before the next prefill. Output never changes, and each instance
says what happened, per request (its kv_transfer_params) and in its counters: no failure reads as
a healthy hand-off."""

from __future__ import annotations

import pytest

from tests.cluster import Cluster
from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import Instance, kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]

BLOCK = 32
FIRST, SECOND = prompt_ids(300, 21), prompt_ids(260, 22)  # 9 and 8 full blocks
MAX_TOKENS = 10


def test_a_store_killed_mid_workload_is_counted_and_reported(tiny_model):
    cluster = Cluster()
    serve, meta = cluster.serve("256MiB")
    settings = {"model": tiny_model, "block_size": BLOCK}
    prefill = Instance("prefill", {**settings, "kv_transfer_config": kv_config("kv_producer", meta)})
    decode = Instance("decode", {**settings, "kv_transfer_config": kv_config("kv_consumer", meta)})
    try:
        handoff = prefill.generate([FIRST], 1, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"][0]
        assert handoff["kvstore_blocks"] == 9 and "kvstore_save_error" not in handoff

        serve.kill()  # after the prefill stored, before the decode
        out = decode.generate([FIRST], MAX_TOKENS, kv_transfer_params=handoff)
        report, sched = out["kv_transfer_params"][0], out["stats"]["scheduler"]
        assert report["kvstore_lookup_failed"] is True
        assert (report["kvstore_loaded_tokens"], report["kvstore_missing_tokens"]) == (0, 9 * BLOCK)
        assert sched["lookup_failures"] == 1 and sched["recomputed_tokens"] == 9 * BLOCK
        assert out["stats"]["worker"]["load_failures"] == 0  # nothing was loaded, nor tried
        assert "was promised 9 blocks, kvstore did not answer" in decode.log()

        second = prefill.generate([SECOND], 1, kv_transfer_params={"do_remote_decode": True})
        answer = second["kv_transfer_params"][0]
        assert answer["kvstore_blocks"] == 0 and answer["kvstore_save_error"]
        assert second["stats"]["worker"]["save_failures"] >= 1 and second["stats"]["scheduler"]["unsaved_blocks"] == 8

        # The same tokens as vLLM computing alone (the prefill instance: its store is gone).
        expected = prefill.generate([FIRST], MAX_TOKENS)["tokens"][0]
        assert out["tokens"][0] == expected
    finally:
        prefill.close()
        decode.close()
        cluster.close()
