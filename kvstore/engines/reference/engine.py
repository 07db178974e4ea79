"""The reference engine: continuous batching over a paged KV cache, with KV from and to kvstore.

Roles differ only in what they do with kvstore:

    prefill    load the cached prefix, compute the rest, save every full block, return 1 token
    decode     load the prefix (the prefill instance saved it), recompute the tail, generate
    colocated  load and save like prefill (when given a store), and generate like decode

With a store and `save_output_kv`, decode and colocated instances also save, when a request
finishes, the full blocks it filled while generating (and a decode instance the prompt blocks it
computed), so the next turn of a conversation finds its whole history in kvstore.

One thread, the caller of `step` (the server's engine thread), owns the scheduler and what the
cache holds; `submit` may be called from any thread. A step takes new requests (looking up their
cached prefix), collects finished loads, asks the scheduler (`scheduler.py`) for a batch, runs it
through the model once, samples greedily, saves the blocks it filled (per layer, overlapping the
compute), and reports requests whose saves have ended. Transfers never block the loop.

Whatever the store does, a request completes: prompt tokens whose KV did not arrive are
recomputed here. When KV the router promised (`expected_cached_tokens`) or the store listed did
not arrive, the request is a *fallback*, counted with its reason.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kvstore.client import KVStoreError
from kvstore.engines.codec import KVBlockCodec, layout_name
from kvstore.engines.keys import KeyScheme
from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.reference.config import EngineConfig, Role
from kvstore.engines.reference.connector import FaultInjector, PendingSave, StoreConnector, fallback_reason
from kvstore.engines.reference.model import ReferenceModel
from kvstore.engines.reference.paged_cache import CacheShape, Chunk, PagedKVCache
from kvstore.engines.reference.scheduler import Batch, Scheduler
from kvstore.engines.reference.sequence import (
    Collect,
    EngineLoad,
    Generation,
    GenerationRequest,
    InvalidRequest,
    RequestSink,
    Sequence,
    StepStats,
    about,
    check_request,
)

__all__ = [
    "EngineConfig",
    "EngineLoad",
    "Generation",
    "GenerationRequest",
    "InvalidRequest",
    "ReferenceEngine",
    "Role",
    "StepStats",
]

log = logging.getLogger("kvstore.engines.reference")


class ReferenceEngine:
    def __init__(
        self,
        model: ReferenceModel,
        config: EngineConfig,
        store: Any | None = None,
        faults: FaultInjector | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.model = model
        self.config = config
        self.clock = clock
        mc = model.config
        self.cache = PagedKVCache(
            CacheShape(
                mc.num_layers, config.cache_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, mc.torch_dtype
            )
        )
        self.scheme = KeyScheme(
            model=f"{mc.name}@{mc.fingerprint}",
            block_size=config.block_size,
            tenant=config.tenant,
            seed=config.hash_seed,
            layout=layout_name(self.cache.layers, config.granularity),
        )
        self.scheduler = Scheduler(config.batching, self.cache, config.block_size)
        self._wake = threading.Event()
        self._inbox: collections.deque[tuple[GenerationRequest, RequestSink]] = collections.deque()
        self._inbox_lock = threading.Lock()
        self._finishing: list[Sequence] = []
        self._load = EngineLoad(0, 0, 0)
        self.connector: StoreConnector | None = None
        self._replicas = store.config.replica_num if store is not None else 1  # a KVClient's
        if store is not None:
            codec = KVBlockCodec(store, self.scheme, self.cache.layers, config.granularity)
            codec.check_scheme()
            self.connector = StoreConnector(codec, self.cache, config.load_deadline_s, faults, self._wake.set)

    def close(self) -> None:
        """Wait for transfers in flight (their blocks come back) and report what they finished."""
        if self.connector is not None:
            self.connector.close()
        self._reap()

    def info(self) -> dict[str, Any]:
        """What a router needs to compute this engine's block keys and transfer sizes."""
        mc = self.model.config
        codec = self.connector.codec if self.connector else None
        return {
            "model": self.scheme.model,
            "role": self.config.role.value,
            "block_size": self.config.block_size,
            "tenant": self.scheme.tenant,
            "layout": self.scheme.layout,
            "hash_seed": self.scheme.seed,
            "fingerprint": self.scheme.fingerprint,
            "object_parts": codec.object_parts if codec else None,
            "kv_bytes_per_token": mc.kv_bytes_per_token,
            "kv_replicas": self._replicas,
            "vocab_size": mc.vocab_size,
            "max_positions": mc.max_positions,
            "tokenizer": "bytes",
            "store": codec is not None,
            "max_num_seqs": self.config.batching.max_num_seqs,
            "max_batch_tokens": self.config.batching.max_batch_tokens,
        }

    def links(self) -> list[Any]:
        """The link monitor's figures of this instance's store client (LinkStats), [] without one."""
        links = getattr(self.connector.codec.client, "links", None) if self.connector else None
        return links() if links is not None else []

    def validate(self, req: GenerationRequest) -> None:
        check_request(req, self.model.config.vocab_size, self.model.config.max_positions)
        tokens, have = len(req.prompt) + self._max_tokens(req), self.config.cache_blocks
        if (blocks := self.cache.shape.blocks_for(tokens)) > have:
            raise InvalidRequest(f"{tokens} tokens (prompt + new) need {blocks} KV blocks; this instance has {have}")

    # -- the loop ------------------------------------------------------------------------------

    def submit(self, req: GenerationRequest, sink: RequestSink) -> None:
        """Queue a validated request (any thread); results go to `sink` on the engine's thread."""
        with self._inbox_lock:
            self._inbox.append((req, sink))
        self._wake.set()

    def load(self) -> EngineLoad:
        """Queue and batch sizes as of the last step, plus what was submitted since (any thread)."""
        with self._inbox_lock:
            pending = list(self._inbox)
        last = self._load
        return EngineLoad(
            last.waiting + len(pending), last.running, last.queued_tokens + sum(len(r.prompt) for r, _ in pending)
        )

    def has_work(self) -> bool:
        return bool(self._inbox or self.scheduler.has_work() or self._finishing)

    def step(self, wait_s: float = 0.0) -> StepStats | None:
        """One iteration (engine thread only). Returns what ran, or None if nothing could, after
        waiting up to `wait_s` for a submission or a transfer to end."""
        self._wake.clear()
        self._take_inbox()
        self._poll_loads()
        self._reap()
        batch = self.scheduler.schedule() if self.scheduler.has_work() else Batch()
        for seq in batch.preempted:
            seq.metrics.preemptions += 1
        for seq in batch.loads:
            self._start_load(seq)
        stats = self._run(batch) if batch.chunks else None
        self._load = EngineLoad(
            len(self.scheduler.waiting),
            len(self.scheduler.loading) + len(self.scheduler.running),
            sum(s.remaining for s in self.scheduler.waiting),
        )
        if stats is None and wait_s > 0:
            deadlines = [s.load.deadline_at for s in self.scheduler.loading if s.load is not None]
            timeout = min([wait_s, *(max(0.0, d - self.clock()) for d in deadlines)])
            self._wake.wait(timeout)
        return stats

    def run(self, stop: threading.Event, idle_wait_s: float = 0.05) -> None:
        """Step until `stop` is set (the server's engine thread)."""
        while not stop.is_set():
            try:
                self.step(idle_wait_s)
            except Exception:  # a bug, not a request's fault: keep serving
                log.exception("engine step failed")

    def generate(self, req: GenerationRequest, emit: Callable[[int], None]) -> Generation:
        """Serve one request alone, stepping on this thread; `emit(token)` as each token is ready."""
        self.validate(req)
        sink = Collect(emit)
        self.submit(req, sink)
        while sink.result is None:
            self.step(wait_s=0.05)
        if isinstance(sink.result, Exception):
            raise sink.result
        return sink.result

    # -- one step ------------------------------------------------------------------------------

    def _max_tokens(self, req: GenerationRequest) -> int:
        return 1 if self.config.role is Role.PREFILL else req.max_tokens

    def _take_inbox(self) -> None:
        with self._inbox_lock:
            new = list(self._inbox)
            self._inbox.clear()
        bs = self.config.block_size
        for req, sink in new:
            n = len(req.prompt)
            seq = Sequence(
                req,
                sink,
                self._max_tokens(req),
                RequestMetrics.measured(req.request_id, self.config.role.value, prompt_tokens=n),
            )
            error: KVStoreError | None = None
            if self.connector is not None:
                seq.prompt_hashes = self.scheme.block_hashes(req.prompt)
                usable = min(len(seq.prompt_hashes), (n - 1) // bs)  # at least one token is computed
                if usable:
                    with about(seq):
                        lookup = self.connector.lookup(seq.prompt_hashes[:usable])
                    seq.listed_blocks, error = lookup.cached_blocks, lookup.error
                    seq.metrics.kv_lookup_failed = lookup.error is not None
                seq.to_load = seq.stored_blocks = seq.listed_blocks
            if not seq.to_load:
                self._judge(seq, error)
            self.scheduler.add(seq)

    def _start_load(self, seq: Sequence) -> None:
        assert self.connector is not None  # only sequences with a store load
        seq.admitted_at = now = self.clock()
        with about(seq):
            seq.load = self.connector.start_load(seq.prompt_hashes[: seq.to_load], seq.table, now)

    def _poll_loads(self) -> None:
        for seq in list(self.scheduler.loading):
            if seq.load.done():
                result = seq.load.result()
                self.scheduler.loaded(seq, result.blocks_loaded)
            elif self.clock() >= seq.load.deadline_at:
                result = seq.load.expired()
                self.scheduler.abandon_load(seq)
            else:
                continue
            seq.load = None
            seq.loaded_blocks = result.blocks_loaded
            seq.metrics.kv_load_s, seq.metrics.kv_load_bytes = result.seconds, result.nbytes
            seq.metrics.kv_load_failed = result.error is not None or result.blocks_loaded < seq.listed_blocks
            self._judge(seq, result.error)

    def _judge(self, seq: Sequence, error: KVStoreError | None) -> None:
        """Count a fallback if KV promised or listed did not arrive."""
        bs = self.config.block_size
        usable = min(len(seq.prompt_hashes), (seq.num_prompt - 1) // bs)
        promised = max(seq.listed_blocks, min(seq.request.expected_cached_tokens // bs, usable))
        if seq.loaded_blocks < promised:
            seq.metrics.fallback = fallback_reason(error)
            seq.metrics.kv_missing_tokens = (promised - seq.loaded_blocks) * bs
        seq.metrics.cached_tokens = seq.loaded_blocks * bs
        seq.metrics.prefill_tokens = seq.num_prompt - seq.loaded_blocks * bs

    def _run(self, batch: Batch) -> StepStats:
        now = self.clock()
        decoding = [s.seq.decoding for s in batch.chunks]
        prefill_tokens = batch.prefill_tokens
        chunks, saves = [], []
        for s in batch.chunks:
            seq = s.seq
            if seq.admitted_at is None:
                seq.admitted_at = now
            chunks.append(
                Chunk(seq.tokens[seq.num_computed : seq.num_computed + s.num_tokens], seq.num_computed, seq.table)
            )
            if self.connector is not None and self.config.saves:
                full = min(len(seq.prompt_hashes), (seq.num_computed + s.num_tokens) // self.config.block_size)
                if full > seq.stored_blocks:
                    saves.append(self._save(seq, seq.prompt_hashes[seq.stored_blocks : full], full))

        def layer_done(layer: int) -> None:
            for save in saves:
                save.layer_done(layer)

        start = self.clock()
        try:
            logits = self.model.forward_batch(chunks, self.cache, layer_done if saves else None)
        except Exception as exc:
            log.exception("a batch of %d sequences failed", len(chunks))
            for s in batch.chunks:
                self._fail(s.seq, exc)
            return StepStats(len(chunks), sum(decoding), prefill_tokens, self.clock() - start)
        finally:
            for v in saves:
                v.close()
        seconds = self.clock() - start
        total = sum(s.num_tokens for s in batch.chunks)
        sampled = logits.argmax(dim=-1).tolist()
        done = self.clock()
        for s, decode, token in zip(batch.chunks, decoding, sampled):
            seq, m = s.seq, s.seq.metrics
            if decode:
                m.decode_steps += 1
                m.decode_steps_with_prefill += bool(prefill_tokens)
                m.decode_steps_prefill_tokens += prefill_tokens
            else:
                m.prefill_compute_s += seconds * s.num_tokens / total
            seq.num_computed += s.num_tokens
            if seq.remaining == 0:
                self._emit(seq, token, done)
        return StepStats(len(chunks), sum(decoding), prefill_tokens, seconds)

    def _save(self, seq: Sequence, hashes: list[bytes], upto: int) -> PendingSave:
        assert self.connector is not None
        with about(seq):
            save = self.connector.start_save(hashes, seq.table[seq.stored_blocks : upto])
        seq.saves.append(save)
        seq.stored_blocks = upto
        return save

    def _emit(self, seq: Sequence, token: int, now: float) -> None:
        seq.tokens.append(token)
        m = seq.metrics
        if seq.last_token_at is None:
            m.ttft_s = now - seq.request.arrival
            seq.first_token_at = now
        else:
            m.itl_s.append(now - seq.last_token_at)
        seq.last_token_at = now
        seq.sink.token(token)
        if seq.finished:
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        """Out of the batch; the blocks it filled saved (they stay pinned until then)."""
        bs = self.config.block_size
        full = seq.num_computed // bs
        if (
            self.connector is not None
            and self.config.save_output_kv
            and self.config.role is not Role.PREFILL
            and full > seq.stored_blocks
        ):
            hashes = self.scheme.block_hashes(seq.tokens[: full * bs])
            self._save(seq, hashes[seq.stored_blocks : full], full).close()
        self.scheduler.finish(seq)
        self._finishing.append(seq)

    def _fail(self, seq: Sequence, error: Exception) -> None:
        self.scheduler.finish(seq)
        seq.sink.failed(error)

    def _reap(self) -> None:
        """Report finished requests whose saves have all ended."""
        waiting = []
        for seq in self._finishing:
            if all(save.done() for save in seq.saves):
                self._complete(seq)
            else:
                waiting.append(seq)
        self._finishing = waiting

    def _complete(self, seq: Sequence) -> None:
        m, bs = seq.metrics, self.config.block_size
        results = [save.result() for save in seq.saves]
        error = next((r.error for r in results if r.error is not None), None)
        m.kv_save_s = sum(r.seconds for r in results)
        m.kv_save_bytes = sum(r.nbytes for r in results)
        m.kv_save_failed = error is not None if results else m.kv_save_failed
        m.queue_s = (seq.admitted_at or seq.request.arrival) - seq.request.arrival
        if m.ttft_s is not None:  # the rest of its TTFT here went to the batch around it
            m.batch_wait_s = max(0.0, m.ttft_s - m.queue_s - (m.kv_load_s or 0.0) - m.prefill_compute_s)
        m.output_tokens = seq.num_generated
        if seq.num_generated > 1 and seq.first_token_at is not None and seq.last_token_at is not None:
            m.tpot_s = (seq.last_token_at - seq.first_token_at) / (seq.num_generated - 1)
        m.e2e_s = self.clock() - seq.request.arrival
        params: dict[str, Any] = {}
        if self.config.role is Role.PREFILL:
            stored = (
                len(seq.prompt_hashes)
                if error is None and self.connector is not None
                else max(seq.loaded_blocks, seq.listed_blocks)
            )
            params = {
                "cached_tokens": stored * bs,
                "first_token": seq.tokens[seq.num_prompt],
                "save_error": repr(error) if error else None,
            }
        seq.sink.done(Generation(seq.tokens[seq.num_prompt :], m, params))
