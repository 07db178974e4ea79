"""The vLLM backend with prefix knowledge from KV events (`kvstore route --backend vllm
--kv-events URL=ENDPOINT ... --store-events ENDPOINT`).

VLLMBackend routes on length and load only: it cannot compute the keys of a vLLM worker's blocks.
This one tokenizes each prompt (the /tokenize call VLLMBackend makes anyway to count it, which
also returns the ids) and asks its PrefixIndex, fed by the instances' and kvstore's KV events,
how many leading tokens each instance and the store hold. The prompt then carries both:
`cached_tokens` (kvstore's, for the route) and `instance_cached` (for PrefixAffinity's choice of
instance).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from kvstore.engines.router.backend import Discovery, Prompt
from kvstore.engines.router.policy import Pools
from kvstore.engines.router.prefix_index import PrefixIndex
from kvstore.engines.router.vllm_backend import CHARS_PER_TOKEN, VLLMBackend

log = logging.getLogger("kvstore.engines.router")


class PrefixVLLMBackend(VLLMBackend):
    name = "vllm"

    def __init__(self, kv_bytes_per_token: int, index: PrefixIndex) -> None:
        super().__init__(kv_bytes_per_token)
        self.index = index

    async def discover(self, http: httpx.AsyncClient, pools: Pools) -> Discovery:
        found = await super().discover(http, pools)
        unknown = set(self.index.instances) - set(pools.prefill + pools.decode + pools.colocated)
        if unknown:
            raise ValueError(f"--kv-events names instances the router does not route to: {sorted(unknown)}")
        return found

    async def prompt(self, http: httpx.AsyncClient, body: dict[str, Any]) -> Prompt:
        if int(body.get("n") or 1) != 1 or int(body.get("best_of") or 1) != 1:
            raise ValueError("the router serves one choice a request: n and best_of must be 1")
        payload = body.get("prompt")
        model = body.get("model") or self.model
        ids: list[int] | None
        if isinstance(payload, list) and payload and all(type(t) is int and t >= 0 for t in payload):
            ids = payload
        elif isinstance(payload, str) and payload:
            ids = await self._tokens(http, model, payload)
            if ids is None:
                return Prompt(payload, max(1, len(payload) // CHARS_PER_TOKEN))
        else:
            raise ValueError("prompt must be a non-empty string or a list of token ids (one prompt a request)")
        hits = self.index.lookup(ids, model)
        return Prompt(
            payload, len(ids), cached_tokens=min(hits.store_tokens, len(ids)), instance_cached=hits.instance_tokens
        )

    async def _tokens(self, http: httpx.AsyncClient, model: str, text: str) -> list[int] | None:
        try:
            resp = await http.post(f"{self.tokenize_url}/tokenize", json={"model": model, "prompt": text})
            resp.raise_for_status()
            return [int(t) for t in resp.json()["tokens"]]
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            if not self._warned_estimate:
                log.warning(
                    "/tokenize on %s failed (%s): routing without prefix knowledge, estimating prompt "
                    "lengths as characters / %d",
                    self.tokenize_url,
                    exc,
                    CHARS_PER_TOKEN,
                )
                self._warned_estimate = True
            return None
