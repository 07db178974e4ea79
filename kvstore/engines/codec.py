"""KVBlockCodec: a paged KV cache's blocks <-> store objects, in batches, without staging copies.

The cache is given as *planes*: block-major tensors where `plane[block_id]` is one contiguous
block of one layer (for a cache shaped `[num_blocks, 2, block_size, heads, dim]` per layer, each
layer is one plane; a `(2, num_blocks, ...)` layout gives two planes, K and V, per layer). Two
object granularities:

- `LAYER`: one object per (block, plane), read and written straight from and into the cache
  (zero copy), so a prefill can save layer l while computing layer l+1, and a decode can load
  layer by layer.
- `BLOCK`: one object per block holding every plane, gathered into (and scattered from) one
  staging buffer: fewer, larger objects for one extra memcpy.

Every call is one batched client call for any number of blocks. Loads never raise for a miss or a
transfer failure: they report how many leading blocks arrived, and the engine recomputes the rest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvstore.client import InvalidArgument, KVStoreError
from kvstore.engines.keys import Granularity, KeyScheme

log = logging.getLogger("kvstore.engines.codec")
STAGING_KEEP = 256 << 20  # the largest BLOCK-load staging buffer a codec keeps between loads


class SchemeMismatch(InvalidArgument):
    """Another deployment already writes this namespace with a different key scheme (seed, block
    size or hash): their keys and ours would never match. Use another tenant/model name or
    align the seeds."""


@dataclass(frozen=True)
class LoadResult:
    """What a load moved. Blocks [0, blocks_loaded) hold valid KV; the rest must be recomputed."""

    blocks_requested: int
    blocks_loaded: int
    nbytes: int
    seconds: float
    error: KVStoreError | None = None  # why loading stopped early, if it did

    @property
    def complete(self) -> bool:
        return self.blocks_loaded == self.blocks_requested


@dataclass(frozen=True)
class SaveResult:
    blocks_written: int  # new objects stored by this call
    blocks_present: int  # already stored (same key, same bytes): skipped
    nbytes: int
    seconds: float
    error: KVStoreError | None = None


def layout_name(planes: Sequence[torch.Tensor], granularity: Granularity) -> str:
    """A layout tag for the key namespace: dtype, plane shapes and granularity."""
    shape = "x".join(str(d) for d in planes[0].shape[1:])
    dtype = str(planes[0].dtype).removeprefix("torch.")
    return f"{dtype}-{len(planes)}p-{shape}-{granularity.value}"


class KVBlockCodec:
    """Moves blocks between `planes` and the store named by `scheme`, through `client`
    (a KVClient, or anything with put_many / get_many_into / match_prefix)."""

    def __init__(
        self,
        client: Any,
        scheme: KeyScheme,
        planes: Sequence[torch.Tensor],
        granularity: Granularity = Granularity.LAYER,
        layer_of_plane: Sequence[int] | None = None,
    ) -> None:
        if not planes:
            raise InvalidArgument("a KV cache needs at least one plane")
        for p in planes:
            if p.device != planes[0].device or not p[0].is_contiguous() or p.shape[0] != planes[0].shape[0]:
                raise InvalidArgument(
                    "planes must be block-major, with contiguous blocks, the same number of "
                    "blocks, and on one device (CPU or CUDA: the client stages device memory)"
                )
        self.client = client
        self.scheme = scheme
        self.planes = list(planes)
        self.granularity = granularity
        self.layer_of_plane = list(layer_of_plane) if layer_of_plane else list(range(len(planes)))
        self._plane_bytes = [p[0].numel() * p.element_size() for p in self.planes]
        self._staging: torch.Tensor | None = None  # BLOCK loads' buffer, kept (see _load_staging)
        self._staging_lock = threading.Lock()
        # Each plane's bytes as one flat view, where the plane is contiguous: a block's view is then
        # a slice (~0.1 us), not a tensor index and a view conversion (~20 us) per object and call.
        self._flat = [p.view(torch.uint8).reshape(-1).numpy().data if p.is_contiguous() else None
                      for p in self.planes]  # fmt: skip

    @property
    def block_nbytes(self) -> int:
        return sum(self._plane_bytes)

    def check_scheme(self) -> bool:
        """Record this scheme in the store, or raise SchemeMismatch if the namespace holds another.
        A store that cannot answer now is not an error (returns False): KV is an optimisation."""
        stored = self.scheme.describe()
        try:
            written = self.client.put(self.scheme.scheme_key, stored)
            found = stored if written else bytes(self.client.get(self.scheme.scheme_key))
        except KVStoreError as exc:
            log.warning("could not check the key scheme in kvstore (%s); continuing", exc)
            return False
        if found != stored:
            raise SchemeMismatch(
                f"{self.scheme.scheme_key} records {found.decode(errors='replace')}, this engine uses {stored.decode()}"
            )
        return True

    # -- keys ----------------------------------------------------------------------------------

    @property
    def object_parts(self) -> list[int] | None:
        """The parts each block is stored as (KeyScheme.object_keys' `parts`): None for BLOCK."""
        return None if self.granularity is Granularity.BLOCK else self._parts(None)

    def _parts(self, layers: Sequence[int] | None) -> list[int]:
        if self.granularity is Granularity.BLOCK:
            return [-1]
        if layers is None:
            return list(range(len(self.planes)))
        return [p for p, layer in enumerate(self.layer_of_plane) if layer in layers]

    def _keys(self, hashes: Sequence[bytes], parts: list[int]) -> list[str]:
        return self.scheme.object_keys(hashes, None if parts == [-1] else parts)

    def cached_blocks(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks are fully stored (every part). Takes no lease; one RPC."""
        if not hashes:
            return 0
        parts = self._parts(None)
        return int(self.client.match_prefix(self._keys(hashes, parts))) // len(parts)

    # -- save ----------------------------------------------------------------------------------

    def save(
        self, hashes: Sequence[bytes], block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> SaveResult:
        """Store blocks `block_ids` (whose chained hashes are `hashes`). With LAYER granularity
        `layers` limits the call to those layers' planes. Never raises a store error: the result
        carries it (a failed save only costs a later recompute)."""
        if len(hashes) != len(block_ids):
            raise InvalidArgument(f"{len(hashes)} hashes for {len(block_ids)} blocks")
        parts = self._parts(layers)
        if not hashes or not parts:
            return SaveResult(0, 0, 0, 0.0)
        start = time.perf_counter()
        if self.granularity is Granularity.BLOCK:
            values = list(self._gather(block_ids))
        else:
            values = [self._block(p, b) for b in block_ids for p in parts]
        keys = self._keys(hashes, parts)
        try:
            written = self.client.put_many(keys, values)
        except KVStoreError as exc:
            return SaveResult(0, 0, 0, time.perf_counter() - start, exc)
        nbytes = sum(_nbytes(v) for v, w in zip(values, written) if w)
        new = sum(written)
        return SaveResult(new // len(parts), (len(keys) - new) // len(parts), nbytes, time.perf_counter() - start)

    def _block(self, plane: int, block: int) -> memoryview:
        """Block `block` of plane `plane` as a flat byte view of the cache (no copy)."""
        flat, n = self._flat[plane], self._plane_bytes[plane]
        if flat is not None:
            return flat[block * n : (block + 1) * n]
        return self.planes[plane][block].view(torch.uint8).reshape(-1).numpy().data

    def _gather(self, block_ids: Sequence[int]) -> torch.Tensor:
        device = self.planes[0].device
        staging = torch.empty(len(block_ids), self.block_nbytes, dtype=torch.uint8, device=device)
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=device)
        off = 0
        for plane, n in zip(self.planes, self._plane_bytes):
            staging[:, off : off + n] = plane.index_select(0, idx).view(torch.uint8).reshape(len(idx), n)
            off += n
        return staging

    def _load_staging(self, blocks: int, kept: bool) -> torch.Tensor:
        """A staging buffer for `blocks` blocks. Up to STAGING_KEEP bytes the `kept` one is reused
        between loads: fresh memory costs a page fault per 4 KiB on first touch."""
        nbytes = blocks * self.block_nbytes
        if nbytes > STAGING_KEEP or not kept:
            return torch.empty(blocks, self.block_nbytes, dtype=torch.uint8)
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = torch.empty(nbytes, dtype=torch.uint8)
        return self._staging[:nbytes].view(blocks, self.block_nbytes)

    def _scatter(self, staging: torch.Tensor, block_ids: Sequence[int]) -> None:
        idx = torch.as_tensor(list(block_ids), dtype=torch.long, device=staging.device)
        off = 0
        for plane, n in zip(self.planes, self._plane_bytes):
            rows = staging[:, off : off + n].view(plane.dtype)  # a strided view: index_copy_ reads it in place
            plane.index_copy_(0, idx, rows.reshape(len(idx), *plane.shape[1:]))
            off += n

    # -- load ----------------------------------------------------------------------------------

    def load(
        self, hashes: Sequence[bytes], block_ids: Sequence[int], layers: Sequence[int] | None = None
    ) -> LoadResult:
        """Read blocks into `block_ids` (one batched get). Blocks after the first one that failed
        are not counted as loaded even if their bytes arrived: KV is only usable as a prefix."""
        if len(hashes) != len(block_ids):
            raise InvalidArgument(f"{len(hashes)} hashes for {len(block_ids)} blocks")
        parts = self._parts(layers)
        if not hashes or not parts:
            return LoadResult(len(hashes), len(hashes), 0, 0.0)
        if self.granularity is not Granularity.BLOCK or not self._staging_lock.acquire(blocking=False):
            return self._load(hashes, block_ids, parts, kept=False)
        try:  # this call has the kept staging buffer; a concurrent one makes its own
            return self._load(hashes, block_ids, parts, kept=True)
        finally:
            self._staging_lock.release()

    def _load(self, hashes: Sequence[bytes], block_ids: Sequence[int], parts: list[int], kept: bool) -> LoadResult:
        start = time.perf_counter()
        keys = self._keys(hashes, parts)
        staging = None
        buffers: list[Any]  # memoryviews into CPU memory, or (device memory) tensor rows the client stages
        if self.granularity is Granularity.BLOCK:
            device = self.planes[0].device
            if device.type != "cpu":  # the client stages device memory itself (kvstore.client.staging)
                staging = torch.empty(len(block_ids), self.block_nbytes, dtype=torch.uint8, device=device)
                buffers = [staging[i] for i in range(len(block_ids))]
            else:
                staging = self._load_staging(len(block_ids), kept)
                flat = staging.reshape(-1).numpy().data
                n = self.block_nbytes
                buffers = [flat[i * n : (i + 1) * n] for i in range(len(block_ids))]
        else:
            buffers = [self._block(p, b) for b in block_ids for p in parts]
        try:
            results = self.client.get_many_into(keys, buffers, strict=False)
        except KVStoreError as exc:  # the metadata service itself failed: nothing arrived
            return LoadResult(len(hashes), 0, 0, time.perf_counter() - start, exc)
        loaded, error = self._leading_blocks(results, buffers, len(parts))
        if staging is not None and loaded:
            self._scatter(staging[:loaded], block_ids[:loaded])
        nbytes = sum(len(b) for b in buffers[: loaded * len(parts)])
        return LoadResult(len(hashes), loaded, nbytes, time.perf_counter() - start, error)

    @staticmethod
    def _leading_blocks(results: list[Any], buffers: list[Any], per_block: int) -> tuple[int, KVStoreError | None]:
        for i, (got, buf) in enumerate(zip(results, buffers)):
            if isinstance(got, KVStoreError):
                return i // per_block, got
            if got != len(buf):
                return i // per_block, InvalidArgument(
                    f"stored object is {got} bytes, the cache block is {len(buf)}: "
                    "the layout differs from the one that saved it"
                )
        return len(results) // per_block, None


def _nbytes(value: Any) -> int:
    return len(value) if isinstance(value, memoryview) else int(value.numel() * value.element_size())
