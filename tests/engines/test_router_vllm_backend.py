"""The router's vLLM mode against in-memory fake vLLM servers (httpx.MockTransport): what each
instance is sent, how its answers are read, and the fallbacks. No vLLM, no sockets."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from kvstore.engines.metrics import MetricsSink
from kvstore.engines.router.backend import Rejected, SchemeConflict
from kvstore.engines.router.policy import CostModel, FixedPolicy, Pools, Route
from kvstore.engines.router.proxy import Router
from kvstore.engines.router.telemetry import Telemetry
from kvstore.engines.router.vllm_backend import CHARS_PER_TOKEN, VLLMBackend

P, D = "http://prefill", "http://decode"
POOLS = Pools((P,), (D,))
PARAMS = {"kvstore_blocks": 3, "kvstore_block_size": 32, "kvstore_fingerprint": "f"}


class FakeVLLM:
    """Two vLLM OpenAI servers: `sent` records each request body by (host, path)."""

    def __init__(
        self,
        *,
        token_ids: bool = True,
        tokenize: bool = True,
        decode_fails_with_params: bool = False,
        prefill_status: int = 200,
        decode_status: int = 200,
        models: dict[str, str] | None = None,
        params: dict[str, Any] = PARAMS,
    ) -> None:
        self.params = params
        self.token_ids = token_ids
        self.tokenize = tokenize
        self.decode_fails_with_params = decode_fails_with_params
        self.prefill_status = prefill_status
        self.decode_status = decode_status
        self.models = models or {}
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    def bodies(self, host: str, path: str = "/v1/completions") -> list[dict[str, Any]]:
        return [b for h, p, b in self.sent if h == host and p == path]

    def handler(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        body = json.loads(request.content) if request.content else {}
        self.sent.append((host, path, body))
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": self.models.get(host, "tiny"), "parent": None}]})
        if path == "/tokenize":
            if not self.tokenize:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json={"count": 100, "max_model_len": 4096, "tokens": list(range(100))})
        if host == "prefill":
            if self.prefill_status != 200:
                return httpx.Response(self.prefill_status, json={"error": {"message": "prefill broke"}})
            return httpx.Response(
                200,
                json={
                    "choices": [{"index": 0, "text": " ka", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 1},
                    "kv_transfer_params": self.params,
                },
            )
        if self.decode_status != 200:
            return httpx.Response(
                self.decode_status, json={"error": {"message": "bad max_tokens", "type": "BadRequestError"}}
            )
        if self.decode_fails_with_params and body.get("kv_transfer_params"):
            return httpx.Response(500, json={"error": {"message": "load failed"}})
        return httpx.Response(200, content=self._stream(body), headers={"content-type": "text/event-stream"})

    def _stream(self, body: dict[str, Any]) -> bytes:
        events = []
        for i, text in enumerate([" ka", " lo", " mi"]):
            choice = {"index": 0, "text": text, "finish_reason": "length" if i == 2 else None}
            if self.token_ids:
                choice["token_ids"] = [10 + i]
            if i == 0 and self.token_ids:
                choice["prompt_token_ids"] = list(range(100))
            events.append(
                {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "tiny", "choices": [choice]}
            )
        events.append(
            {
                "id": "cmpl-x",
                "object": "text_completion",
                "created": 1,
                "model": "tiny",
                "choices": [],
                "usage": {"prompt_tokens": 100, "completion_tokens": 3, "total_tokens": 103},
            }
        )
        return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def serve(fake: FakeVLLM, body: dict[str, Any], pools: Pools = POOLS) -> tuple[list[dict[str, Any]], Router]:
    async def go() -> tuple[list[dict[str, Any]], Router]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(fake.handler)) as http:
            backend = VLLMBackend(kv_bytes_per_token=1024)
            found = await backend.discover(http, pools)
            model = CostModel(kv_bytes_per_token=found.kv_bytes_per_token)
            telemetry = Telemetry(model)
            router = Router(pools, FixedPolicy(Route.PD, model), telemetry, backend, http, MetricsSink("router"))
            return [e async for e in router.complete(body)], router

    return asyncio.run(go())


BODY = {"prompt": "ka lo mi ne tu", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True}


def test_pd_prefills_with_one_token_and_hands_kv_transfer_params_to_decode():
    fake = FakeVLLM()
    events, router = serve(fake, BODY)
    (prefill,), (decode,) = fake.bodies("prefill"), fake.bodies("decode")
    assert prefill["max_tokens"] == 1 and prefill["stream"] is False
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True}
    assert prefill["model"] == "tiny" and prefill["prompt"] == BODY["prompt"]  # text: vLLM tokenizes
    assert prefill["temperature"] == 0 and prefill["ignore_eos"] is True
    assert decode["kv_transfer_params"] == PARAMS and decode["max_tokens"] == 3
    assert decode["stream"] is True and decode["return_token_ids"] is True
    assert decode["stream_options"]["include_usage"] is True
    assert fake.bodies("prefill", "/tokenize") == [{"model": "tiny", "prompt": BODY["prompt"]}]
    assert "".join(e["choices"][0]["text"] for e in events) == " ka lo mi"
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == [10, 11, 12]
    assert all("prompt_token_ids" not in e["choices"][0] for e in events)  # not asked for
    assert len({e["id"] for e in events}) == 1
    last = events[-1]
    assert last["usage"]["completion_tokens"] == 3 and last["choices"][0]["finish_reason"] == "length"
    rec = last["kvstore"]
    assert rec["route"] == "pd" and rec["prompt_tokens"] == 100 and rec["output_tokens"] == 3
    assert rec["prefill_tokens"] == 100 and rec["prefill_compute_s"] > 0 and rec["ttft_s"] > 0
    assert rec["fallback"] is None and rec["error"] is None
    assert (rec["kv_save_failed"], rec["kv_lookup_failed"], rec["kv_missing_tokens"]) == (False, None, None)
    # What the decode instance loaded or recomputed is not in vLLM's stream: unknown, not 0.
    for unmeasured in ("cached_tokens", "recompute_tokens", "kv_load_bytes", "kv_load_s", "kv_load_failed"):
        assert rec[unmeasured] is None, unmeasured
    assert router.telemetry.prefill_tps() != router.telemetry.model.default_prefill_tps  # measured
    assert all(load.requests == 0 and load.tokens == 0 for load in router.loads().values())


def test_chunks_without_token_ids_count_by_text_and_usage():
    events, _ = serve(FakeVLLM(token_ids=False), BODY)
    assert all(e["choices"][0]["token_ids"] == [] for e in events)
    rec = events[-1]["kvstore"]
    assert rec["output_tokens"] == 3 and rec["ttft_s"] > 0 and rec["tpot_s"] is not None


def test_a_decode_failure_before_the_first_token_recomputes_without_the_handoff():
    fake = FakeVLLM(decode_fails_with_params=True)
    events, router = serve(fake, BODY)
    first, second = fake.bodies("decode")
    assert first["kv_transfer_params"] == PARAMS and "kv_transfer_params" not in second
    assert "".join(e["choices"][0]["text"] for e in events) == " ka lo mi"
    assert events[-1]["kvstore"]["fallback"] == "decode_failed"
    assert router.sink.fallbacks() == 1


def test_a_failed_prefill_leaves_decode_to_recompute():
    fake = FakeVLLM(prefill_status=500)
    events, _ = serve(fake, BODY)
    (decode,) = fake.bodies("decode")
    assert "kv_transfer_params" not in decode
    assert events[-1]["kvstore"]["fallback"] == "prefill_failed"


def test_without_tokenize_prompt_length_is_estimated_from_characters():
    events, _ = serve(FakeVLLM(tokenize=False), {**BODY, "prompt": "x" * 400})
    assert events[-1]["kvstore"]["prompt_tokens"] == 400 // CHARS_PER_TOKEN


def test_token_id_prompts_are_counted_and_forwarded_as_they_are():
    fake = FakeVLLM()
    events, _ = serve(fake, {**BODY, "prompt": [5, 6, 7]})
    assert fake.bodies("prefill", "/tokenize") == []
    assert fake.bodies("decode")[0]["prompt"] == [5, 6, 7]
    assert events[-1]["kvstore"]["prompt_tokens"] == 3


def test_a_request_the_instance_rejects_is_not_retried():
    fake = FakeVLLM(decode_status=400)
    with pytest.raises(Rejected, match="bad max_tokens"):
        serve(fake, BODY, Pools((P,), (D,), ("http://colocated",)))
    assert len(fake.bodies("decode")) == 1 and fake.bodies("colocated") == []


def test_malformed_prompts_are_refused_before_any_instance_is_asked():
    for body in ({**BODY, "prompt": ""}, {**BODY, "prompt": ["a", "b"]}, {**BODY, "n": 2}):
        fake = FakeVLLM()
        with pytest.raises(ValueError):
            serve(fake, body)
        assert fake.bodies("prefill") == [] and fake.bodies("decode") == []


def test_instances_serving_different_models_are_refused():
    with pytest.raises(SchemeConflict, match="different models"):
        serve(FakeVLLM(models={"prefill": "a", "decode": "b"}), BODY)


def test_a_prefill_whose_saves_failed_hands_over_nothing_and_says_so():
    """Issue 18: the connector reports that kvstore holds none of the blocks (a dead store): the
    decode instance is not told to wait for them, and the record and counters show the fallback."""
    failed = {
        "kvstore_blocks": 0,
        "kvstore_block_size": 32,
        "kvstore_lookup_failed": True,
        "kvstore_save_error": "kvstore did not answer: the saves are unconfirmed",
    }
    fake = FakeVLLM(params=failed)
    events, router = serve(fake, BODY)
    (decode,) = fake.bodies("decode")
    assert "kv_transfer_params" not in decode
    rec = events[-1]["kvstore"]
    assert rec["route"] == "pd" and rec["fallback"] == "save_failed" and rec["error"] is None
    assert (rec["kv_save_failed"], rec["kv_lookup_failed"], rec["kv_missing_tokens"]) == (True, True, 96)
    assert rec["recompute_tokens"] is None and rec["kv_load_bytes"] is None
    assert router.sink.fallbacks() == 1
    text = router.sink.exposition().decode()
    assert 'kvstore_router_kv_failures_total{stage="save"} 1.0' in text
    assert 'kvstore_router_tokens_total{kind="kv_missing"} 96.0' in text


def test_a_partly_stored_prefill_promises_what_kvstore_holds():
    partial = {**PARAMS, "kvstore_blocks": 1, "kvstore_save_error": "kvstore holds 1 of the 3 blocks saved"}
    fake = FakeVLLM(params=partial)
    events, _ = serve(fake, BODY)
    assert fake.bodies("decode")[0]["kv_transfer_params"] == partial
    rec = events[-1]["kvstore"]
    assert rec["fallback"] == "save_failed" and rec["kv_missing_tokens"] == 96 - 32
