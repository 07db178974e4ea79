"""The reference engine: one request at a time through the model, with KV from and to kvstore.

Roles differ only in what they do with kvstore:

    prefill    load the cached prefix, compute the rest, save every full block, return 1 token
    decode     load the prefix (the prefill instance saved it), recompute the tail, generate
    colocated  load and save like prefill (when given a store), and generate like decode

Whatever the store does, a request completes: prompt tokens whose KV did not arrive are
recomputed here. When KV the router promised (`expected_cached_tokens`) or the store listed did
not arrive, the request is a *fallback*, counted with its reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Sequence

from kvstore.engines.codec import Granularity, KVBlockCodec, SaveResult, layout_name
from kvstore.engines.keys import KeyScheme
from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.reference.connector import FaultInjector, StoreConnector, fallback_reason
from kvstore.engines.reference.model import ReferenceModel
from kvstore.engines.reference.paged_cache import CacheShape, PagedKVCache


class Role(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"


@dataclass(frozen=True)
class EngineConfig:
    role: Role = Role.COLOCATED
    block_size: int = 16
    cache_blocks: int = 1024
    granularity: Granularity = Granularity.LAYER
    load_deadline_s: float = 5.0
    tenant: str = "default"
    hash_seed: int = 0

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.cache_blocks <= 0:
            raise ValueError("block_size and cache_blocks must be positive")
        if self.load_deadline_s <= 0:
            raise ValueError("load_deadline_s must be positive")

    @property
    def saves(self) -> bool:
        return self.role is not Role.DECODE


class InvalidRequest(ValueError):
    """The request can never be served as written (bad token ids, too long)."""


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt: Sequence[int]
    max_tokens: int
    expected_cached_tokens: int = 0     # prompt tokens kvstore should hold (the router's word)
    arrival: float = field(default_factory=time.perf_counter)


@dataclass
class Generation:
    tokens: list[int]
    metrics: RequestMetrics
    kv_transfer_params: dict[str, Any]


class ReferenceEngine:
    """Not thread safe: one caller (the server's worker thread) runs `generate` at a time."""

    def __init__(self, model: ReferenceModel, config: EngineConfig, store: Any | None = None,
                 faults: FaultInjector | None = None) -> None:
        self.model = model
        self.config = config
        mc = model.config
        self.cache = PagedKVCache(CacheShape(mc.num_layers, config.cache_blocks, config.block_size,
                                             mc.num_kv_heads, mc.head_dim, mc.torch_dtype))
        self.scheme = KeyScheme(model=f"{mc.name}@{mc.fingerprint}", block_size=config.block_size,
                                tenant=config.tenant, seed=config.hash_seed,
                                layout=layout_name(self.cache.layers, config.granularity))
        self.connector: StoreConnector | None = None
        if store is not None:
            codec = KVBlockCodec(store, self.scheme, self.cache.layers, config.granularity)
            codec.check_scheme()
            self.connector = StoreConnector(codec, self.cache, config.load_deadline_s, faults)

    def close(self) -> None:
        if self.connector is not None:
            self.connector.close()

    def info(self) -> dict[str, Any]:
        """What a router needs to compute this engine's block keys and transfer sizes."""
        mc = self.model.config
        codec = self.connector.codec if self.connector else None
        return {"model": self.scheme.model, "role": self.config.role.value, "block_size": self.config.block_size,
                "tenant": self.scheme.tenant, "layout": self.scheme.layout, "hash_seed": self.scheme.seed,
                "fingerprint": self.scheme.fingerprint, "object_parts": codec.object_parts if codec else None,
                "kv_bytes_per_token": mc.kv_bytes_per_token, "vocab_size": mc.vocab_size,
                "max_positions": mc.max_positions, "tokenizer": "bytes", "store": codec is not None}

    def validate(self, req: GenerationRequest) -> None:
        mc = self.model.config
        if not req.prompt:
            raise InvalidRequest("empty prompt")
        if req.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1")
        if max(req.prompt) >= mc.vocab_size:
            raise InvalidRequest(f"token id {max(req.prompt)} is outside the vocabulary ({mc.vocab_size})")
        if len(req.prompt) + req.max_tokens > mc.max_positions:
            raise InvalidRequest(f"{len(req.prompt)} prompt + {req.max_tokens} new tokens is over "
                                 f"the {mc.max_positions}-token context")

    def generate(self, req: GenerationRequest, emit: Callable[[int], None]) -> Generation:
        """Serve one request; `emit(token)` is called as each token is ready."""
        self.validate(req)
        begin = time.perf_counter()
        prompt = list(req.prompt)
        n, bs = len(prompt), self.config.block_size
        max_tokens = 1 if self.config.role is Role.PREFILL else req.max_tokens
        m = RequestMetrics(req.request_id, self.config.role.value, prompt_tokens=n, queue_s=begin - req.arrival)
        conn = self.connector
        hashes = self.scheme.block_hashes(prompt) if conn else []
        usable = min(len(hashes), (n - 1) // bs)        # at least one prompt token is computed
        table = self.cache.allocate(self.cache.shape.blocks_for(n + max_tokens))
        save = None
        try:
            loaded, stored, load_error = 0, 0, None
            if conn is not None and usable:
                lookup = conn.lookup(hashes[:usable])
                stored, load_error = lookup.cached_blocks, lookup.error
                if stored:
                    outcome = conn.load(hashes[:stored], table)
                    table, loaded, load_error = outcome.table, outcome.result.blocks_loaded, outcome.result.error
                    m.kv_load_s, m.kv_load_bytes = outcome.result.seconds, outcome.result.nbytes
            promised = max(stored, min(req.expected_cached_tokens // bs, usable))
            if loaded < promised:
                m.fallback = fallback_reason(load_error)
            start = loaded * bs
            m.cached_tokens, m.prefill_tokens = start, n - start
            if conn is not None and self.config.saves:
                first_new = max(loaded, stored)
                save = conn.start_save(hashes[first_new:], table[first_new:len(hashes)])
            t0 = time.perf_counter()
            logits = self.model.forward(prompt[start:], start, self.cache, table,
                                        save.layer_done if save else None)
            token = int(logits.argmax())
            m.prefill_compute_s = time.perf_counter() - t0
            tokens = [token]
            params: dict[str, Any] = {}
            if self.config.role is Role.PREFILL:
                saved = save.finish() if save else SaveResult(0, 0, 0, 0.0)
                self._record_save(m, saved)
                stored_blocks = len(hashes) if saved.error is None and conn else max(loaded, stored)
                params = {"cached_tokens": stored_blocks * bs, "first_token": token,
                          "save_error": repr(saved.error) if saved.error else None}
            emit(token)
            first = time.perf_counter()
            m.ttft_s = first - req.arrival
            pos = n
            for _ in range(max_tokens - 1):
                logits = self.model.forward([token], pos, self.cache, table)
                token = int(logits.argmax())
                tokens.append(token)
                emit(token)
                pos += 1
            if len(tokens) > 1:
                m.tpot_s = (time.perf_counter() - first) / (len(tokens) - 1)
            m.output_tokens = len(tokens)
        finally:
            if save is not None:
                self._record_save(m, save.finish())     # blocks are read until the save ends
            self.cache.free(table)
        m.e2e_s = time.perf_counter() - req.arrival
        return Generation(tokens, m, params)

    @staticmethod
    def _record_save(m: RequestMetrics, saved: SaveResult) -> None:
        m.kv_save_s, m.kv_save_bytes = saved.seconds, saved.nbytes
