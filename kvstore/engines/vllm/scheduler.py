"""The connector's scheduler side: how much of each prompt kvstore holds, which blocks to load and
to save each step, and when a finished request's blocks may be freed.

One store call per lookup (lookups.py). Only full prompt blocks are named (the chained hashes of
kvstore.engines.keys); a hybrid model's prompt is named in chunks that span a block of every KV
cache group, and saved only in chunks every group still holds (groups.py). A synchronous load never
claims the prompt's last token, which vLLM must compute to sample; after an asynchronous load vLLM
recomputes that one token itself.
A failed lookup is a miss, and lookups pause for `lookup_backoff_s` so a store that is down costs
each request nothing (nor does it wait for blocks a prefill promised: they cannot arrive).

What went wrong is counted, never only logged: failed and skipped lookups, prompt tokens
recomputed because KV that was promised or listed did not arrive, and blocks a PD prefill saved
that kvstore does not hold when it finishes (checked by one lookup, so that its answer promises
only what the decode instance can load). Each finished request's `kv_transfer_params` say what
happened to it (`kvstore_*` keys; see `finished`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kvstore import blockhash
from kvstore.engines.keys import KeyScheme, engine_name
from kvstore.engines.vllm.config import BlockNames, ConnectorConfig
from kvstore.engines.vllm.groups import GroupKind, GroupLayout
from kvstore.engines.vllm.lookups import Lookup, StoreLookups
from kvstore.engines.vllm.metadata import BlockJob, LoadJob, NamingHandshake, StepMetadata, TransferStats

log = logging.getLogger("vllm.kvstore.scheduler")

# A decode instance told by a prefill that blocks are coming re-asks at most this often.
_REMOTE_POLL_S = 0.005


@dataclass
class _Tracked:
    """A request the connector has seen. Blocks [0, stored) are known to be in kvstore (found by a
    lookup); blocks [0, dispatched) have been handed to the workers to save or were stored."""

    request: Any
    hashes: list[bytes]
    stored: int = 0
    dispatched: int = 0
    local_tokens: int = 0  # vLLM's own prefix hit when the connector was last asked
    saving: bool = False  # some save was dispatched for it
    loading: frozenset[int] = frozenset()  # block ids of its last load
    load_failed: bool = False  # a load failed: recompute from now on, never load again
    lookup_failed: bool = False  # a lookup for it failed, or was skipped as kvstore was failing
    loaded_blocks: int = 0  # blocks granted to a load and not reported failed
    missing_blocks: int = 0  # blocks promised or listed that did not arrive: recomputed
    accounted: bool = False  # its lookup's outcome is counted (once per request)
    first_ask: float = field(default_factory=time.monotonic)
    last_ask: float = 0.0


class SchedulerSide:
    def __init__(
        self,
        config: ConnectorConfig,
        block_size: int,
        load: bool,
        save: bool,
        client: Any | None = None,
        groups: GroupLayout | None = None,
    ) -> None:
        self.config = config
        # A hybrid model (several KV cache groups) is named and looked up in chunks (groups.py).
        self.groups = groups if groups is not None and groups.hybrid else None
        self.block_size = self.groups.chunk_tokens if self.groups is not None else block_size
        # A hit ending on the prompt's last token is not offered when some group keeps only its
        # last blocks (sliding window, state): vLLM recomputes that token, and the blocks it
        # needs to do so would lie outside what it allocated for the hit.
        self._keep_last_token = self.groups is not None and any(
            g.kind is not GroupKind.FULL for g in self.groups.groups
        )
        self.load_enabled = load
        self.save_enabled = save
        # Hashes depend only on the seed and block size, so they can be computed before the
        # workers report how they lay out blocks; keys need that layout (`naming`).
        self._hashing = KeyScheme(
            model=config.model_id, layout="-", block_size=self.block_size, tenant=config.tenant, seed=config.hash_seed
        )
        self.scheme: KeyScheme | None = None
        self.parts: list[int] | None = None
        self.lookups = StoreLookups(config, self.groups, self._count, client)
        self._requests: dict[str, _Tracked] = {}
        self._loads: list[LoadJob] = []
        self.stats = {
            "lookups": 0,
            "lookup_failures": 0,
            "lookups_skipped": 0,
            "hit_tokens": 0,
            "hit_requests": 0,
            "saved_blocks_dispatched": 0,
            "recomputed_tokens": 0,
            "unsaved_blocks": 0,
        }
        self.interval = TransferStats()  # the counters vLLM exports (vllm:kvstore_*_total)

    # -- naming --------------------------------------------------------------------------------

    def set_naming(self, by_rank: dict[int, NamingHandshake]) -> None:
        """Take rank 0's block naming (each rank keys its own shard; a lookup checks rank 0's)."""
        if not by_rank:
            return
        first = by_rank[min(by_rank)]
        if first.block_size != self.block_size or first.seed != self.config.hash_seed:
            raise ValueError(
                f"kvstore connector: worker names blocks with block_size={first.block_size} "
                f"seed={first.seed}; the scheduler uses {self.block_size}/{self.config.hash_seed}"
            )
        self.scheme = KeyScheme(
            model=first.model, layout=first.layout, block_size=first.block_size, tenant=first.tenant, seed=first.seed
        )
        if self.scheme.fingerprint != first.fingerprint:
            raise ValueError(
                "kvstore connector: scheduler and worker disagree on the key scheme "
                f"({self.scheme.fingerprint} != {first.fingerprint})"
            )
        self.parts = first.parts
        log.info(
            "kvstore: blocks named %s (%d objects a block, %d bytes a block, fingerprint %s)",
            self.scheme.namespace,
            len(self.parts or [None]),
            first.block_nbytes,
            first.fingerprint,
        )

    def close(self) -> None:
        self.lookups.close()

    def _count(self, **values: int) -> None:
        for name, value in values.items():
            self.stats[name] += value
        self.interval.add(**values)

    def take_interval_stats(self) -> TransferStats | None:
        """The exported counters since the last call (vLLM adds them to the workers')."""
        if self.interval.is_empty():
            return None
        stats, self.interval = self.interval, TransferStats()
        return stats

    # -- lookups -------------------------------------------------------------------------------

    def _track(self, request: Any) -> _Tracked:
        t = self._requests.get(request.request_id)
        if t is None:
            t = self._requests[request.request_id] = _Tracked(request, self._hashes(request))
        return t

    def _hashes(self, request: Any) -> list[bytes]:
        tokens = request.prompt_token_ids
        if tokens is None or getattr(request, "mm_features", None):
            return []  # prompt embeddings / images: their KV is not named by tokens
        if self.config.block_names is BlockNames.VLLM:  # one vLLM hash per block (connector.py checks)
            engine = getattr(request, "block_hashes", None) or []
            return [engine_name(h) for h in engine[: len(tokens) // self.block_size]]
        return self._hashing.block_hashes(tokens, _extra_key(request))

    def _stored_blocks(self, hashes: list[bytes]) -> Lookup:
        if not hashes or self.scheme is None:
            return Lookup(0, False)
        return self.lookups.stored(self.scheme.object_keys(hashes, self.parts), len(self.parts or [None]))

    def num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        if not self.load_enabled:
            return 0, False
        t = self._track(request)
        if t.load_failed:
            return 0, False
        cap = len(t.hashes)
        if not self.config.load_async or self._keep_last_token:
            # A load before the forward must leave the last prompt token to compute; after an async
            # load vLLM itself recomputes just that token, so every full block can be loaded.
            cap = min(cap, (request.num_prompt_tokens - 1) // self.block_size)
        if cap * self.block_size <= num_computed_tokens:
            return 0, False
        now = time.monotonic()
        promised = min(int(_params(request).get("kvstore_blocks", 0)), cap)
        if promised and now - t.last_ask < _REMOTE_POLL_S and now - t.first_ask < self.config.remote_save_wait_s:
            return None, False
        t.last_ask = now
        lookup = self._stored_blocks(t.hashes[:cap])
        t.lookup_failed = t.lookup_failed or lookup.failed
        stored = lookup.blocks
        if stored < promised and not lookup.failed and now - t.first_ask < self.config.remote_save_wait_s:
            return None, False  # the prefill's saves are still landing: ask again next step
        if not t.accounted:
            t.accounted = True
            missing = max(0, promised - max(stored, num_computed_tokens // self.block_size))
            if missing:
                t.missing_blocks += missing
                self._count(recomputed_tokens=missing * self.block_size)
                found = "kvstore did not answer" if lookup.failed else f"kvstore holds {stored}"
                log.warning(
                    "kvstore: request %s was promised %d blocks, %s; vLLM recomputes %d",
                    request.request_id,
                    promised,
                    found,
                    missing,
                )
        t.stored = max(t.stored, stored)
        t.local_tokens = num_computed_tokens
        external = stored * self.block_size - num_computed_tokens
        if external <= 0:
            return 0, False
        return external, self.config.load_async

    def after_alloc(self, request: Any, block_ids: Any, num_external_tokens: int) -> None:
        """`block_ids`: the request's block table (a hybrid model's: one list per group)."""
        if num_external_tokens <= 0:
            return
        t = self._track(request)
        first = t.local_tokens // self.block_size
        last = first + num_external_tokens // self.block_size
        hashes = tuple(t.hashes[first:last])
        if self.groups is not None:
            chunks = tuple(self.groups.chunk_blocks(block_ids, first, last))
            job = LoadJob(request.request_id, hashes, (), chunks, asynchronous=self.config.load_async)
        else:
            job = LoadJob(request.request_id, hashes, tuple(block_ids[first:last]), asynchronous=self.config.load_async)
        self._loads.append(job)
        t.loading = frozenset(job.all_block_ids())
        t.loaded_blocks += len(job.block_ids)
        self.stats["hit_requests"] += 1
        self.stats["hit_tokens"] += num_external_tokens

    def load_errors(self, invalid_block_ids: set[int]) -> None:
        """Workers reported these blocks as not loaded: their requests recompute, and are not
        offered a load again (the blocks are still listed, so a retry would fail the same way)."""
        if not invalid_block_ids:
            return
        for req_id, t in self._requests.items():
            failed = len(t.loading & invalid_block_ids)
            if failed:
                t.load_failed = True
                t.loaded_blocks -= failed
                t.missing_blocks += failed
                self._count(recomputed_tokens=failed * self.block_size)
                log.info("kvstore: request %s recomputes the %d blocks it could not load", req_id, failed)

    def failed_loads(self, req_ids: set[str]) -> None:
        """Workers could not load these (hybrid) requests: vLLM recomputes each whole prompt."""
        for req_id in req_ids:
            t = self._requests.get(req_id)
            if t is not None and not t.load_failed:
                t.load_failed = True
                t.missing_blocks += t.loaded_blocks
                self._count(recomputed_tokens=t.loaded_blocks * self.block_size)
                t.loaded_blocks = 0
                log.info("kvstore: request %s could not load its chunks; vLLM recomputes it", req_id)

    # -- per step ------------------------------------------------------------------------------

    def build_meta(self, scheduler_output: Any, block_ids_of: Any) -> StepMetadata:
        """The step's loads (from after_alloc) and saves: every full prompt block that this step
        completes and kvstore does not already hold. `block_ids_of(req_id)` is the request's
        block table (a hybrid model's: one list per group)."""
        meta = StepMetadata(loads=self._loads, preempted=set(scheduler_output.preempted_req_ids or ()))
        self._loads = []
        if not self.save_enabled:
            return meta
        cached = scheduler_output.scheduled_cached_reqs
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        for req_id, before in computed.items():
            t = self._requests.get(req_id)
            if t is None or not t.hashes:
                continue
            done = min(
                len(t.hashes), (before + scheduler_output.num_scheduled_tokens.get(req_id, 0)) // self.block_size
            )
            start = max(t.dispatched, t.stored)
            if done <= start:
                continue
            meta.saves.extend(self._save_job(req_id, t.hashes, block_ids_of(req_id), start, done))
            t.dispatched = done
            t.saving = True
            self.stats["saved_blocks_dispatched"] += done - start
        return meta

    def _save_job(self, req_id: str, hashes: list[bytes], block_ids: Any, start: int, done: int) -> list[BlockJob]:
        if self.groups is None:
            return [BlockJob(req_id, tuple(hashes[start:done]), tuple(block_ids[start:done]))]
        whole = self.groups.whole_chunks(hashes[start:done], block_ids, start)
        return [BlockJob(req_id, tuple(h for h, _ in whole), (), tuple(c for _, c in whole))] if whole else []

    def finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        """(hold the blocks until the workers ack the saves, kv_transfer_params for the response).

        The params say what kvstore did for the request: `kvstore_loaded_tokens` (prompt tokens
        loaded), `kvstore_missing_tokens` (promised or listed, did not arrive: recomputed),
        `kvstore_lookup_failed`; a producer adds `kvstore_blocks` (leading blocks stored, for the
        decode instance) and `kvstore_block_size`, and after a failed save `kvstore_save_error`.
        For a PD prefill (`do_remote_decode`) with synchronous saves, `kvstore_blocks` is what
        kvstore holds when the request ends (one lookup), not what was sent."""
        t = self._requests.pop(request.request_id, None)
        if t is None:
            return False, None
        params: dict[str, Any] = {
            "kvstore_loaded_tokens": t.loaded_blocks * self.block_size,
            "kvstore_missing_tokens": t.missing_blocks * self.block_size,
            "kvstore_lookup_failed": t.lookup_failed,
        }
        if not self.save_enabled:
            return False, params
        blocks = max(t.dispatched, t.stored)
        params.update(kvstore_blocks=blocks, kvstore_block_size=self.block_size)
        if self.scheme is not None:
            params["kvstore_fingerprint"] = self.scheme.fingerprint
        if blocks and _params(request).get("do_remote_decode") and not self.config.save_async:
            params.update(self._confirm_saved(request.request_id, t.hashes[:blocks]))
        return self.config.save_async and t.saving, params

    def _confirm_saved(self, req_id: str, hashes: list[bytes]) -> dict[str, Any]:
        """How many of a finished prefill's blocks kvstore holds (its saves are done: synchronous
        saves end before the step's output). {} when all of them."""
        lookup = self._stored_blocks(hashes)
        if not lookup.failed and lookup.blocks == len(hashes):
            return {}
        self._count(unsaved_blocks=len(hashes) - lookup.blocks)
        error = (
            "kvstore did not answer: the saves are unconfirmed"
            if lookup.failed
            else f"kvstore holds {lookup.blocks} of the {len(hashes)} blocks saved: a save failed"
        )
        log.warning("kvstore: request %s: %s; the decode instance recomputes the rest", req_id, error)
        return {"kvstore_blocks": lookup.blocks, "kvstore_save_error": error}


def _params(request: Any) -> dict[str, Any]:
    return getattr(request, "kv_transfer_params", None) or {}


def _extra_key(request: Any) -> bytes:
    """What else decides a block's KV besides its tokens: the LoRA adapter and the cache salt (in
    kvstore.blockhash's encoding, which the indexer and the router also use)."""
    lora = getattr(request, "lora_request", None)
    return blockhash.extra_key(lora.lora_name if lora is not None else None, getattr(request, "cache_salt", None))
