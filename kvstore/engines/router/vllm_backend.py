"""The router's backend for vLLM OpenAI servers running kvstore's connector
(`python -m vllm.entrypoints.openai.api_server ... --kv-transfer-config '{"kv_connector":
"KVStoreConnector", "kv_connector_module_path": "kvstore.engines.vllm", ...}'`).

The PD protocol of vLLM's example proxies: the prefill instance (kv_producer) is sent the request
with max_tokens=1 and `kv_transfer_params: {"do_remote_decode": true}`; the connector saves the
prompt's blocks and answers with `kv_transfer_params` (`kvstore_blocks`, `kvstore_block_size`),
which the router copies into the decode request; the decode instance (kv_consumer) loads those
blocks from kvstore and streams. The client's other fields (sampling, stop, ignore_eos, ...) go to
both instances unchanged, and the prompt stays text: vLLM tokenizes it, identically on both sides.

What the router cannot know here, and how it copes:
- Prompt length: asked of a prefill instance's /tokenize (one small local call), else estimated
  as characters / 4 (`CHARS_PER_TOKEN`).
- Cached prefixes: a block's key depends on the worker's cache layout, which vLLM does not publish,
  so the router does not look prompts up (cached_tokens = 0) and routes on length and load. Every
  instance's connector still looks its prompts up and loads what kvstore holds.
- Phase timings: vLLM reports none per request. Prefill is the router's wall time for the prefill
  call (HTTP and the synchronous KV save included); TTFT and TPOT are timed as tokens arrive.
- The link: vLLM reports no per-request load times, so the cost model keeps `--bandwidth`, and KV
  bytes per token are not discoverable: `--kv-bytes-per-token` sets them.
- What the decode instance loaded or recomputed: vLLM's streamed answer carries no
  kv_transfer_params, so the record leaves cached_tokens, recompute_tokens and the KV load figures
  None (not measured), never 0. Each instance counts its own (`vllm:kvstore_lookup_failures_total`,
  `vllm:kvstore_recomputed_tokens_total`, ... on its /metrics).
- What the prefill instance stored: its kv_transfer_params say how many leading blocks kvstore
  holds once it finished (the connector checks), and why not all of them (`kvstore_save_error`):
  the decode instance is promised only those, and the record gets a `save_failed` fallback.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.router.backend import Discovery, Handoff, Prompt, SchemeConflict, all_instances
from kvstore.engines.router.policy import Pools, Route
from kvstore.engines.router.telemetry import Telemetry

log = logging.getLogger("kvstore.engines.router")

CHARS_PER_TOKEN = 4  # the usual estimate for English text with a BPE tokenizer
# Fields that make no sense on a one-token prefill whose output is thrown away.
_NOT_FOR_PREFILL = (
    "stream",
    "stream_options",
    "min_tokens",
    "max_completion_tokens",
    "echo",
    "logprobs",
    "prompt_logprobs",
    "return_token_ids",
    "kv_transfer_params",
)


class VLLMBackend:
    name = "vllm"

    def __init__(self, kv_bytes_per_token: int) -> None:
        if kv_bytes_per_token <= 0:
            raise ValueError("kv_bytes_per_token must be positive")
        self.kv_bytes_per_token = kv_bytes_per_token
        self.model = ""  # what every instance serves (from /v1/models)
        self.tokenize_url = ""  # the instance asked to count prompt tokens
        self._warned_estimate = False

    async def discover(self, http: httpx.AsyncClient, pools: Pools) -> Discovery:
        """Read every instance's /v1/models; refuse instances that serve different models."""
        served = {}
        for url in all_instances(pools):
            resp = await http.get(f"{url}/v1/models")
            resp.raise_for_status()
            models = resp.json()["data"]
            base = [m["id"] for m in models if not m.get("parent")] or [m["id"] for m in models]
            served[url] = base[0]
        if len(set(served.values())) != 1:
            raise SchemeConflict(
                "vLLM instances serve different models: " + ", ".join(f"{u}: {m}" for u, m in served.items())
            )
        self.model = next(iter(served.values()))
        self.tokenize_url = (pools.prefill or pools.colocated or pools.decode)[0]
        return Discovery(self.kv_bytes_per_token, frozenset())

    # -- the prompt ----------------------------------------------------------------------------

    async def prompt(self, http: httpx.AsyncClient, body: dict[str, Any]) -> Prompt:
        if int(body.get("n") or 1) != 1 or int(body.get("best_of") or 1) != 1:
            raise ValueError("the router serves one choice a request: n and best_of must be 1")
        payload = body.get("prompt")
        if isinstance(payload, list) and payload and all(type(t) is int and t >= 0 for t in payload):
            return Prompt(payload, len(payload))
        if not isinstance(payload, str) or not payload:
            raise ValueError("prompt must be a non-empty string or a list of token ids (one prompt a request)")
        return Prompt(payload, await self._count(http, body.get("model") or self.model, payload))

    async def _count(self, http: httpx.AsyncClient, model: str, text: str) -> int:
        try:
            resp = await http.post(f"{self.tokenize_url}/tokenize", json={"model": model, "prompt": text})
            resp.raise_for_status()
            return int(resp.json()["count"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            if not self._warned_estimate:
                log.warning(
                    "/tokenize on %s failed (%s): estimating prompt lengths as characters / %d",
                    self.tokenize_url,
                    exc,
                    CHARS_PER_TOKEN,
                )
                self._warned_estimate = True
            return max(1, len(text) // CHARS_PER_TOKEN)

    # -- requests ------------------------------------------------------------------------------

    def prefill_body(self, body: dict[str, Any], prompt: Prompt) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in _NOT_FOR_PREFILL}
        out.update(
            model=body.get("model") or self.model,
            prompt=prompt.payload,
            max_tokens=1,
            stream=False,
            kv_transfer_params={"do_remote_decode": True},
        )
        return out

    def prefilled(
        self, answer: dict[str, Any], wall_s: float, prompt: Prompt, rec: RequestMetrics, telemetry: Telemetry
    ) -> Handoff | None:
        computed = int(answer["usage"]["prompt_tokens"])
        rec.prefill_tokens, rec.prefill_compute_s = computed, wall_s
        telemetry.record_prefill(computed, wall_s)
        params = answer.get("kv_transfer_params")
        if not params:
            # No connector on the prefill instance, or one that saves nothing: decode recomputes.
            log.warning(
                "request %s: the prefill instance returned no kv_transfer_params; is it a kvstore kv_producer?",
                rec.request_id,
            )
            rec.fallback = "save_failed"
            rec.add_failures(save=True)
            return None
        block = int(params.get("kvstore_block_size", 0))
        stored = int(params.get("kvstore_blocks", 0)) * block
        error = params.get("kvstore_save_error")
        rec.add_failures(lookup=params.get("kvstore_lookup_failed"), save=error is not None)
        if error is not None:
            # Blocks kvstore never got are recomputed by the decode instance, whatever it finds.
            rec.fallback = "save_failed"
            rec.add_failures(missing_tokens=max(0, computed // block * block - stored) if block else None)
            log.warning(
                "request %s: the prefill instance stored %d of the prompt's %d tokens of KV (%s)",
                rec.request_id,
                stored,
                computed,
                error,
            )
        if stored <= 0:
            return None  # nothing to hand over: the decode instance computes the prompt
        return Handoff(params, min(stored, computed))

    def promised(self, prompt: Prompt) -> Handoff | None:
        return None  # the decode instance's connector finds a cached prefix itself

    def generate_body(self, body: dict[str, Any], prompt: Prompt, handoff: Handoff | None) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
        out.update(
            model=body.get("model") or self.model,
            prompt=prompt.payload,
            stream=True,
            return_token_ids=True,
            stream_options={**(body.get("stream_options") or {}), "include_usage": True},
        )
        if handoff is not None:
            out["kv_transfer_params"] = handoff.kv_transfer_params
        return out

    def fold(self, body: dict[str, Any], route: Route, telemetry: Telemetry) -> _Fold:
        return _Fold(keep_prompt_ids=bool(body.get("return_token_ids")))


class _Fold:
    """vLLM's chunks, relayed with `token_ids` always present (a chunk without them counts one token
    if it has text); its usage-only chunk (choices: []) is held back and its usage sent on the
    router's last event, which also repeats the finish reason."""

    def __init__(self, keep_prompt_ids: bool) -> None:
        self.keep_prompt_ids = keep_prompt_ids
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.model = ""
        self.created = int(time.time())

    def chunk(self, event: dict[str, Any], rec: RequestMetrics) -> tuple[dict[str, Any] | None, int]:
        self.usage = event.get("usage") or self.usage
        self.model = event.get("model") or self.model
        self.created = event.get("created") or self.created
        choices = event.get("choices") or []
        if not choices:
            return None, 0
        choice = choices[0]
        ids = choice.get("token_ids")
        tokens = len(ids) if ids is not None else int(bool(choice.get("text")))
        choice["token_ids"] = list(ids or [])
        choice.setdefault("text", "")
        if not self.keep_prompt_ids:
            choice.pop("prompt_token_ids", None)
        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return event, tokens

    def finish(self, rec: RequestMetrics) -> dict[str, Any] | None:
        if self.usage:
            rec.output_tokens = int(self.usage.get("completion_tokens", rec.output_tokens))
        return {
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }
