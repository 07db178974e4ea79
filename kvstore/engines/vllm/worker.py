"""The connector's worker side: the KV cache registered once, blocks saved layer by layer as the
forward pass computes them, loads run before the forward or between steps, and every failed load
reported by block id so that vLLM (kv_load_failure_policy "recompute") recomputes those blocks.

Bytes move between vLLM's cache tensors and kvstore through kvstore.engines.codec, straight from and
into the cache blocks (no staging copy at "layer" granularity). Nothing here raises a store error
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
from kvstore.engines.codec import KVBlockCodec, LoadResult, SaveResult, SchemeMismatch, layout_name
from kvstore.engines.keys import Granularity, KeyScheme
from kvstore.engines.vllm.config import ConnectorConfig
from kvstore.engines.vllm.metadata import BlockJob, LoadJob, NamingHandshake, StepMetadata, TransferStats
from kvstore.engines.vllm.save_batch import InFlightSaves

log = logging.getLogger("vllm.kvstore.worker")


class UnsupportedCache(ValueError):
    """The KV cache tensors are not laid out as block-major CPU memory this connector can move."""


def cache_planes(
    kv_caches: dict[str, torch.Tensor], num_blocks: int
) -> tuple[list[torch.Tensor], list[int], dict[str, int]]:
    """Split vLLM's per-layer cache tensors into block-major planes, whatever the backend's layout:
    `[num_blocks, ...]` (CPU, MLA, ...) is one plane; `[2, num_blocks, ...]` is two (K and V).
    Returns (planes, layer index of each plane, layer index of each layer name). Layers that share
    one tensor (cross-layer KV sharing) are stored once."""
    planes: list[torch.Tensor] = []
    layer_of_plane: list[int] = []
    layer_of_name: dict[str, int] = {}
    seen: dict[tuple[int, tuple[int, ...]], int] = {}
    for name, t in kv_caches.items():
        ident = (t.data_ptr(), tuple(t.shape))
        if ident in seen:
            layer_of_name[name] = seen[ident]
            continue
        layer = seen[ident] = layer_of_name[name] = len(seen)
        if t.device.type != "cpu":
            raise UnsupportedCache(
                f"layer {name}: the KV cache is on {t.device}; this connector moves CPU caches (vLLM's CPU build) only"
            )
        if t.dim() >= 2 and t.shape[0] == num_blocks:
            split = [t]
        elif t.dim() >= 3 and t.shape[0] == 2 and t.shape[1] == num_blocks:
            split = [t[0], t[1]]
        else:
            raise UnsupportedCache(
                f"layer {name}: KV cache shape {tuple(t.shape)} has no block dimension "
                f"of size {num_blocks} first (or after a leading K/V dimension of 2)"
            )
        for plane in split:
            if not plane[0].is_contiguous():
                raise UnsupportedCache(
                    f"layer {name}: a block of shape {tuple(plane.shape[1:])} is not "
                    "contiguous; it cannot be moved as one object"
                )
            planes.append(plane)
            layer_of_plane.append(layer)
    if not planes:
        raise UnsupportedCache("no KV cache tensors were registered")
    return planes, layer_of_plane, layer_of_name


class WorkerSide:
    def __init__(
        self, config: ConnectorConfig, block_size: int, num_blocks: int, layout_suffix: str, client: Any | None = None
    ) -> None:
        self.config = config
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.layout_suffix = layout_suffix
        self._client = client
        self.codec: KVBlockCodec | None = None
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
        planes, layer_of_plane, self._layer_of_name = cache_planes(kv_caches, self.num_blocks)
        layout = f"{layout_name(planes, self.config.granularity)}-{self.layout_suffix}"
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
        self.codec = KVBlockCodec(self._client, scheme, planes, self.config.granularity, layer_of_plane)
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
            len(planes),
            self.num_blocks,
            len(set(layer_of_plane)),
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
        for job in meta.loads:
            if self.codec is None:
                self._load_errors.update(job.block_ids)
                continue
            if job.asynchronous:
                future = self._load_pool.submit(self.codec.load, list(job.hashes), list(job.block_ids))
                self._loading[job.req_id] = (job, future)
            else:
                self._loaded(job, self.codec.load(list(job.hashes), list(job.block_ids)))

    def _loaded(self, job: LoadJob, result: LoadResult) -> None:
        failed = job.block_ids[result.blocks_loaded :]
        self._count(loads=1, load_blocks=result.blocks_loaded, load_bytes=result.nbytes, load_s=result.seconds)
        if failed:
            self._load_errors.update(failed)
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

    # -- saves -----------------------------------------------------------------------------------

    def save_layer(self, meta: StepMetadata, layer_name: str) -> None:
        """Layer `layer_name` of this step is computed: store that layer of every block the step
        completes (layer granularity; block granularity saves everything in `end_step`)."""
        if not meta.saves or self.codec is None or self.config.granularity is not Granularity.LAYER:
            return
        layer = self._layer_of_name.get(layer_name)
        if layer is not None:
            self._submit_save(self.codec, meta.saves, layer)

    def end_step(self, meta: StepMetadata) -> None:
        """The forward pass is done. Synchronous saves: wait until this step's blocks are stored
        (by this step's saves, or by earlier ones still writing some of them), so a finished
        request's output goes out only after its KV is in kvstore."""
        if meta.saves and self.codec is not None and self.config.granularity is Granularity.BLOCK:
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

    def _submit_save(self, codec: KVBlockCodec, jobs: Sequence[BlockJob], layer: int | None) -> None:
        """Submit one put_many for `jobs`' blocks (of `layer`; None: whole blocks), each block
        once and none that a save in flight is already writing (save_batch.py)."""
        batch = self._in_flight.plan(jobs, layer)
        self._step_waits.update((id(f), f) for f in batch.waits)
        # Every layer of a step leaves out the same repeats: count the step's blocks, not layers'.
        self._step_deduped = max(self._step_deduped, batch.repeated + batch.in_flight)
        if not batch.hashes:
            return
        layers = None if layer is None else [layer]
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
