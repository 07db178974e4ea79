"""The connector's worker side: the KV cache registered once, blocks saved layer by layer as the
forward pass computes them, loads run before the forward or between steps, and every failed load
reported by block id so that vLLM (kv_load_failure_policy "recompute") recomputes those blocks.

Bytes move between vLLM's cache tensors and kvstore through kvstore.engines.codec, straight from and
into the cache blocks of a CPU cache (no staging copy at "layer" granularity); a CUDA cache and a
hybrid model's chunks go through host staging rows instead (planes.py, staged_codec.py), copied on
a side stream as each layer (whole objects: the step) finishes. A hybrid model's failed load is
reported by request, not block (vLLM's block ids are per group). Nothing here raises a store error
into vLLM: a failed save costs a later recompute, a failed load is recomputed now.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import torch

from kvstore.client import KVClient, KVStoreError
from kvstore.config import ClientConfig
from kvstore.engines.codec import KVBlockCodec, LoadResult, SaveResult, SchemeMismatch
from kvstore.engines.keys import Granularity, KeyScheme, Shard
from kvstore.engines.vllm.config import BlockNames, ConnectorConfig
from kvstore.engines.vllm.groups import GroupLayout
from kvstore.engines.vllm.metadata import BlockJob, LoadJob, NamingHandshake, StepMetadata, TransferStats
from kvstore.engines.vllm.planes import UnsupportedCache, cache_planes, open_codec, read_planes
from kvstore.engines.vllm.save_batch import InFlightSaves
from kvstore.engines.vllm.staged_codec import StagedCodec

log = logging.getLogger("vllm.kvstore.worker")
__all__ = ["UnsupportedCache", "WorkerSide", "cache_planes"]  # cache_planes: where tests have found it


class WorkerSide:
    def __init__(
        self,
        config: ConnectorConfig,
        block_size: int,
        num_blocks: int,
        layout_suffix: str,
        client: Any | None = None,
        groups: GroupLayout | None = None,
        shard: Shard | None = None,
    ) -> None:
        """`layout_suffix` names this worker's shard in the keys (connector._layout_suffix);
        `shard.writes` False: another TP rank holds (and stores) the same KV, so this one only loads."""
        self.config = config
        self.groups = groups if groups is not None and groups.hybrid else None
        # A hybrid model's keys name chunks (groups.py): its block size is the chunk's.
        self.block_size = self.groups.chunk_tokens if self.groups is not None else block_size
        self.num_blocks = num_blocks
        self.layout_suffix = layout_suffix
        self.writes = shard is None or shard.writes
        self._client = client
        self.codec: KVBlockCodec | StagedCodec | None = None
        self._failed_loads: set[str] = set()  # hybrid: requests whose async load fell short
        self.handshake: NamingHandshake | None = None
        self._layer_of_name: dict[str, int] = {}
        self._save_pool = ThreadPoolExecutor(1, thread_name_prefix="kvstore-save")
        self._load_pool = ThreadPoolExecutor(1, thread_name_prefix="kvstore-load")
        self._step_saves: list[Future[SaveResult]] = []
        self._step_waits: dict[int, Future[SaveResult]] = {}  # earlier saves this step's blocks need
        self._step_deduped = 0
        self._in_flight = InFlightSaves()
        self._saving: dict[str, list[Future[SaveResult]]] = {}  # async saves by request
        self._uncounted: list[list[Future[SaveResult]]] = []  # async saves by step
        self._finished: set[str] = set()  # finished, saves still running
        self._loading: dict[str, tuple[LoadJob, Future[LoadResult]]] = {}
        self._load_errors: set[int] = set()
        self._idle_step = False
        self.interval = TransferStats()
        self.totals = TransferStats()
        self._client_seen: dict[tuple[str, str, str], tuple[int, int, float]] = {}

    # -- registration ----------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor], model: str) -> NamingHandshake:
        cache = read_planes(kv_caches, self.num_blocks, self.groups, self.config.granularity)
        self._layer_of_name = cache.layer_of_name
        layout = f"{cache.layout}-{self.layout_suffix}"
        if self.config.block_names is BlockNames.VLLM:  # never one namespace for two hashes
            layout += "-vllmnames"
        scheme = KeyScheme(
            model=model,
            layout=layout,
            block_size=self.block_size,
            tenant=self.config.tenant,
            seed=self.config.hash_seed,
        )
        if self._client is None:
            self._client = KVClient(
                self.config.meta,
                ClientConfig(
                    timeout_s=self.config.transfer_timeout_s, transports=self.config.transports, token=self.config.token
                ),
            )
        self.codec = open_codec(self._client, scheme, cache, self.groups, self.config)
        try:
            self.codec.check_scheme()
        except SchemeMismatch:
            raise
        except KVStoreError as exc:  # the store may come up later: run, and miss until it does
            log.warning(
                "kvstore: could not record the key scheme at %s (%s: %s); continuing",
                self.config.meta,
                type(exc).__name__,
                exc,
            )
        self.handshake = NamingHandshake(
            model,
            layout,
            self.block_size,
            self.config.tenant,
            self.config.hash_seed,
            self.codec.object_parts,
            scheme.fingerprint,
            self.codec.block_nbytes,
        )
        log.info(
            "kvstore: registered %d cache planes of %d blocks for %d layers as %s (%d bytes a block)",
            len(cache.planes),
            self.num_blocks,
            len(set(cache.layer_of_plane)),
            scheme.namespace,
            self.codec.block_nbytes,
        )
        return self.handshake

    def close(self) -> None:
        self._save_pool.shutdown(wait=True)
        self._load_pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- loads -----------------------------------------------------------------------------------

    def start_loads(self, meta: StepMetadata, idle: bool = False) -> None:
        """Start this step's loads. `idle`: the step runs no forward pass (vLLM is only waiting
        for transfers), so `finished` may block briefly instead of letting the engine spin."""
        self._idle_step = idle
        after = self.codec.mark() if isinstance(self.codec, StagedCodec) and meta.loads else None
        for job in meta.loads:
            if self.codec is None:
                self._load_errors.update(job.block_ids)
                continue
            if job.asynchronous:
                future = self._load_pool.submit(self._load, self.codec, job, after)
                self._loading[job.req_id] = (job, future)
            else:
                self._loaded(job, self._load(self.codec, job, after))

    @staticmethod
    def _load(codec: KVBlockCodec | StagedCodec, job: BlockJob, after: Any) -> LoadResult:
        """`after`: the engine stream's work when the load was asked for (staged codecs wait for it)."""
        if isinstance(codec, StagedCodec):
            return codec.load(list(job.hashes), list(job.refs()), after)
        return codec.load(list(job.hashes), list(job.block_ids))

    def _loaded(self, job: LoadJob, result: LoadResult) -> None:
        failed = job.refs()[result.blocks_loaded :]
        self._count(loads=1, load_blocks=result.blocks_loaded, load_bytes=result.nbytes, load_s=result.seconds)
        if failed:
            if self.groups is not None:
                # Block ids are per group, so vLLM takes a hybrid model's load failures by request
                # (KVConnectorTransferResults.failed_recving): it recomputes the whole request.
                self._failed_loads.add(job.req_id)
            else:
                self._load_errors.update(ref[0] for ref in failed)
            self._count(load_failures=1, failed_blocks=len(failed))
            err = result.error
            log.warning(
                "kvstore: load for request %s got %d of %d blocks (%s: %s); vLLM recomputes the other %d",
                job.req_id,
                result.blocks_loaded,
                len(job.block_ids),
                type(err).__name__ if err else "miss",
                err,
                len(failed),
            )
        else:
            log.debug(
                "kvstore: loaded %d blocks (%d tokens, %d bytes) for request %s in %.1f ms",
                result.blocks_loaded,
                result.blocks_loaded * self.block_size,
                result.nbytes,
                job.req_id,
                result.seconds * 1e3,
            )

    def load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def failed_loads(self) -> set[str]:
        """Hybrid models: requests whose async load fell short since the last call (reported with
        `finished`'s receives, in the same step)."""
        failed, self._failed_loads = self._failed_loads, set()
        return failed

    # -- saves -----------------------------------------------------------------------------------

    def save_layer(self, meta: StepMetadata, layer_name: str) -> None:
        """Layer `layer_name` of this step is computed: store that layer of every block the step
        completes (layer granularity; block granularity saves everything in `end_step`)."""
        if not meta.saves or not self.writes or self.codec is None or self._saves_whole(self.codec):
            return
        layer = self._layer_of_name.get(layer_name)
        if layer is not None:
            self._submit_save(self.codec, meta.saves, layer)

    def end_step(self, meta: StepMetadata) -> None:
        """The forward pass is done. Synchronous saves: wait until this step's blocks are stored
        (by this step's saves, or by earlier ones still writing some of them), so a finished
        request's output goes out only after its KV is in kvstore."""
        if meta.saves and self.writes and self.codec is not None and self._saves_whole(self.codec):
            self._submit_save(self.codec, meta.saves, None)
        futures, self._step_saves = self._step_saves, []
        waits, self._step_waits = list(self._step_waits.values()), {}
        if self._step_deduped:
            self._count(save_deduped=self._step_deduped)
            self._step_deduped = 0
        if self.config.save_async:
            for job in meta.saves:  # every one, even if nothing was submitted: each gets its ack
                self._saving.setdefault(job.req_id, []).extend(futures + waits)
            if futures:
                self._uncounted.append(futures)
        else:
            for earlier in waits:  # counted with the step that submitted it
                earlier.result()
            self._collect_saves(futures)

    def _saves_whole(self, codec: KVBlockCodec | StagedCodec) -> bool:
        """Whole blocks (chunks) at the end of the step, else each layer as it finishes."""
        return codec.whole if isinstance(codec, StagedCodec) else self.config.granularity is Granularity.BLOCK

    def _submit_save(self, codec: KVBlockCodec | StagedCodec, jobs: Sequence[BlockJob], layer: int | None) -> None:
        """Submit one put_many for `jobs`' blocks (of `layer`; None: whole blocks), each block
        once and none that a save in flight is already writing (save_batch.py)."""
        batch = self._in_flight.plan(jobs, layer)
        self._step_waits.update((id(f), f) for f in batch.waits)
        # Every layer of a step leaves out the same repeats: count the step's blocks, not layers'.
        self._step_deduped = max(self._step_deduped, batch.repeated + batch.in_flight)
        if not batch.hashes:
            return
        layers = None if layer is None else [layer]
        future: Future[SaveResult]
        if isinstance(codec, StagedCodec):
            # The copy out of the cache is queued now, on this (the engine's) thread: after the
            # layer's compute on its stream, before the blocks can be reused. Only the put waits.
            future = self._save_pool.submit(codec.put, codec.stage(batch.hashes, batch.refs, layers))
        else:
            future = self._save_pool.submit(codec.save, batch.hashes, batch.block_ids, layers)
        self._in_flight.started(batch, layer, future)
        self._step_saves.append(future)

    def _collect_saves(self, futures: list[Future[SaveResult]]) -> None:
        results = [f.result() for f in futures]
        if not results:
            return
        error = next((r.error for r in results if r.error is not None), None)
        written = min(r.blocks_written + r.blocks_present for r in results)
        self._count(
            saves=1,
            save_blocks=written,
            save_bytes=sum(r.nbytes for r in results),
            save_s=sum(r.seconds for r in results),
        )
        if error is not None:
            self._count(save_failures=1)
            log.warning(
                "kvstore: save failed (%s: %s); those blocks will be recomputed when needed",
                type(error).__name__,
                error,
            )

    def drain_saves(self) -> None:
        """Before preempted requests' blocks are reused: let every save in flight finish."""
        for futures in self._saving.values():
            for f in futures:
                f.result()

    # -- completion ------------------------------------------------------------------------------

    def finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(requests whose held blocks may be freed: their async saves are stored,
        requests whose async loads ended, well or not)."""
        if self._idle_step and self._loading:
            # Nothing else to run: yield the GIL to the load rather than spin through empty steps.
            wait([f for _, f in self._loading.values()], timeout=0.005, return_when=FIRST_COMPLETED)
        recving = set()
        for req_id, (job, future) in list(self._loading.items()):
            if future.done():
                del self._loading[req_id]
                self._loaded(job, future.result())
                recving.add(req_id)
        sending = set()
        self._finished.update(r for r in finished_req_ids if r in self._saving)
        for futures in [g for g in self._uncounted if all(f.done() for f in g)]:
            self._uncounted.remove(futures)
            self._collect_saves(futures)
        for req_id in list(self._finished):
            if all(f.done() for f in self._saving[req_id]):
                del self._saving[req_id]
                self._finished.discard(req_id)
                sending.add(req_id)
        return sending or None, recving or None

    def _count(self, **values: float) -> None:
        self.interval.add(**values)
        self.totals.add(**values)

    def take_interval_stats(self) -> TransferStats | None:
        if self.interval.is_empty():
            return None
        self._fold_client_totals()
        stats, self.interval = self.interval, TransferStats()
        return stats

    def _fold_client_totals(self) -> None:
        """The store client's transfers since the last interval, per (transport, daemon,
        direction): vLLM carries them to its /metrics process with the rest (TransferPromMetrics)."""
        metrics = getattr(self._client, "metrics", None)
        if metrics is None:
            return
        for key, now in metrics.totals().items():
            before = self._client_seen.get(key, (0, 0, 0.0))
            self._client_seen[key] = now
            self.interval.add_client(key, *(a - b for a, b in zip(now, before)))
