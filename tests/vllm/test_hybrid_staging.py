"""The CUDA cache path on vLLM's CPU build, through its host stand-in (`stage_host_caches`): a
prefill whose worker moves its cache as a CUDA worker does (host staging rows, copies queued as each
layer finishes, the put on the save thread) hands off to a decode that reads the store in place;
both name and lay out blocks alike, so the decode loads every block and matches plain vLLM."""

from __future__ import annotations

from typing import Any

import pytest

from tests.vllm.conftest import needs_vllm
from tests.vllm.harness import Instance, kv_config
from tests.vllm.tiny_model import prompt_ids

pytestmark = [pytest.mark.slow, needs_vllm, pytest.mark.timeout(600)]

BLOCK = 32
P = prompt_ids(230, 81)
MAX_TOKENS = 10


def _instance(name: str, model: str, kv: dict[str, Any] | None = None) -> Instance:
    return Instance(name, {"model": model, "block_size": BLOCK, **({"kv_transfer_config": kv} if kv else {})})


def test_staged_prefill_hands_off_to_an_in_place_decode(store: tuple[str, Any], tiny_model: str) -> None:
    plain = _instance("plain", tiny_model)
    try:
        expected = plain.generate([P], MAX_TOKENS)["tokens"][0]
    finally:
        plain.close()
    prefill = _instance("staged-prefill", tiny_model, kv_config("kv_producer", store[0], stage_host_caches=True))
    try:
        first = prefill.generate([P], 1, kv_transfer_params={"do_remote_decode": True})
        params = first["kv_transfer_params"][0]
        assert params["kvstore_blocks"] == len(P) // BLOCK and "kvstore_save_error" not in params
        assert first["stats"]["worker"]["save_blocks"] == len(P) // BLOCK
    finally:
        prefill.close()
    decode = _instance("in-place-decode", tiny_model, kv_config("kv_consumer", store[0]))
    try:
        out = decode.generate([P], MAX_TOKENS, kv_transfer_params=params)
        worker = out["stats"]["worker"]
        assert worker["load_failures"] == 0 and worker["load_blocks"] == (len(P) - 1) // BLOCK
        assert out["tokens"][0] == expected
    finally:
        decode.close()
