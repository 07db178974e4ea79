"""StagedCodec: a KV cache's blocks <-> store objects through host staging rows, for the caches
kvstore.engines.codec cannot move in place: a hybrid model's (several KV cache groups) and a CUDA
cache (device_copies.py), or a CPU cache with `stage_host_caches` (the CUDA path's host stand-in).

A staged row is one unit of a key: one block of a single-group model, or one chunk of a hybrid
model (groups.py), holding for each group in order its blocks of the chunk, and for each block
every plane (layer, or K / V of a layer) of the group. A single-group model stores a row as one
object per plane ("layer" granularity: the same keys and bytes as KVBlockCodec) or one object
("block"). A hybrid model always stores one object per chunk, because a chunk's groups must be
stored together or not at all, under everything the store does:

- one object per chunk is present or absent as a whole: its put commits atomically (PutEnd), a
  failed put leaves nothing, and eviction, demotion or loss drops all of it; a lookup asks one key
  per chunk (`match_prefix`, or `exists_many` when no group needs the whole prefix).
- a per-group key plus a commit marker written after them guards only the write side: the store
  evicts keys one by one, so the marker can outlive a group key it vouches for, and a lookup that
  trusts it offers a partial set (checking every group key as well costs the marker's point).

The price: one gather copy per save (no layer-by-layer saves for hybrid models), and a
sliding-window group's blocks stored for every chunk, though a hit needs only its last few (each
chunk may end some later hit). Saves never take a chunk with a group's block missing (the scheduler
leaves such chunks out); loads fill only the blocks vLLM allocated (NULL_BLOCK entries are skipped),
so a sliding-window group reads its window only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from kvstore.client import InvalidArgument, KVStoreError
from kvstore.engines.codec import LoadResult, SaveResult, SchemeMismatch
from kvstore.engines.keys import Granularity, KeyScheme
from kvstore.engines.vllm.device_copies import DeviceCopies, GatherPart, ScatterPart, Staged
from kvstore.engines.vllm.groups import NULL_BLOCK, GroupLayout

log = logging.getLogger("vllm.kvstore.staged")


class _Column(NamedTuple):
    """Bytes of a row: block slot `slot` (a column of the row's block ids) of plane `plane` of
    group `group`, whose layer is `layer`."""

    group: int
    slot: int
    plane: int
    layer: int
    nbytes: int


@dataclass
class StagedSave:
    keys: list[str]
    rows: Staged
    object_bytes: list[int]  # the sizes of one row's objects, in order


class StagedCodec:
    """`planes[g]`: group g's block-major planes. `layer_of_plane` (single group): the layer of each
    plane, so that "layer" granularity saves one layer's planes as it finishes."""

    def __init__(
        self,
        client: Any,
        scheme: KeyScheme,
        layout: GroupLayout,
        planes: Sequence[Sequence[torch.Tensor]],
        copies: DeviceCopies,
        granularity: Granularity = Granularity.BLOCK,
        layer_of_plane: Sequence[int] | None = None,
    ) -> None:
        if len(planes) != len(layout.groups) or not all(planes):
            raise InvalidArgument(f"{len(planes)} plane lists for {len(layout.groups)} KV cache groups")
        self.client = client
        self.scheme = scheme
        self.layout = layout
        self.planes = [list(p) for p in planes]
        self.copies = copies
        self.whole = layout.hybrid or granularity is Granularity.BLOCK  # one object per row
        layers = list(layer_of_plane) if layer_of_plane else list(range(len(self.planes[0])))
        self._columns: list[_Column] = []
        slot = 0
        for g, group_planes in enumerate(self.planes):
            for _ in range(layout.blocks_per_chunk(g)):
                for p, plane in enumerate(group_planes):
                    layer = layers[p] if not layout.hybrid else p
                    self._columns.append(_Column(g, slot, p, layer, plane[0].numel() * plane.element_size()))
                slot += 1
        self.width = slot  # block ids per row
        self.block_nbytes = sum(c.nbytes for c in self._columns)  # bytes per row

    @property
    def object_parts(self) -> list[int] | None:
        return None if self.whole else list(range(len(self.planes[0])))

    def check_scheme(self) -> bool:
        """As KVBlockCodec.check_scheme: record the scheme, or raise SchemeMismatch."""
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

    def mark(self) -> Any:
        return self.copies.mark()

    def _ids(self, refs: Sequence[tuple[int, ...]]) -> torch.Tensor:
        if any(len(r) != self.width for r in refs):
            raise InvalidArgument(f"each row needs {self.width} block ids")
        device = self.planes[0][0].device
        return torch.tensor([list(r) for r in refs], dtype=torch.long).reshape(len(refs), self.width).to(device)

    # -- save ----------------------------------------------------------------------------------

    def stage(
        self, hashes: Sequence[bytes], refs: Sequence[tuple[int, ...]], layers: Sequence[int] | None = None
    ) -> StagedSave:
        """Start copying rows `refs` (of `layers`' planes only, with "layer" granularity) to host
        memory, after the work queued so far on the calling thread's stream; `put` stores them."""
        if len(hashes) != len(refs):
            raise InvalidArgument(f"{len(hashes)} hashes for {len(refs)} rows")
        ids = self._ids(refs)
        if self.layout.hybrid and bool((ids == NULL_BLOCK).any()):
            raise InvalidArgument("a chunk to save lacks some group's block: it would not be whole")
        columns = [c for c in self._columns if self.whole or layers is None or c.layer in layers]
        parts, offset = [], 0
        for c in columns:
            parts.append(GatherPart(self.planes[c.group][c.plane], ids[:, c.slot], offset, c.nbytes))
            offset += c.nbytes
        rows = self.copies.gather(parts, len(refs), offset)
        if self.whole:
            return StagedSave(self.scheme.object_keys(hashes), rows, [offset])
        keys = self.scheme.object_keys(hashes, [c.plane for c in columns])
        return StagedSave(keys, rows, [c.nbytes for c in columns])

    def put(self, staged: StagedSave) -> SaveResult:
        """Store staged rows (one put_many). Never raises a store error: the result carries it."""
        start = time.perf_counter()
        staged.rows.wait()
        values = _objects(staged.rows.host, staged.object_bytes)
        per_row = len(staged.object_bytes)
        try:
            written = self.client.put_many(staged.keys, values) if values else []
        except KVStoreError as exc:
            return SaveResult(0, 0, 0, time.perf_counter() - start, exc)
        nbytes = sum(len(v) for v, w in zip(values, written) if w)
        new = sum(written)
        return SaveResult(new // per_row, (len(values) - new) // per_row, nbytes, time.perf_counter() - start)

    def save(
        self, hashes: Sequence[bytes], refs: Sequence[tuple[int, ...]], layers: Sequence[int] | None = None
    ) -> SaveResult:
        return self.put(self.stage(hashes, refs, layers))

    # -- load ----------------------------------------------------------------------------------

    def load(self, hashes: Sequence[bytes], refs: Sequence[tuple[int, ...]], after: Any = None) -> LoadResult:
        """Read rows and fill the blocks they name (never NULL_BLOCK), after `after` (an event
        from `mark`). Rows after the first that failed are not loaded, even if their bytes
        arrived: KV is usable only as a prefix."""
        if len(hashes) != len(refs):
            raise InvalidArgument(f"{len(hashes)} hashes for {len(refs)} rows")
        if not hashes:
            return LoadResult(0, 0, 0, 0.0)
        start = time.perf_counter()
        ids = self._ids(refs)
        host = self.copies.host_rows(len(refs), self.block_nbytes)
        sizes = [self.block_nbytes] if self.whole else [c.nbytes for c in self._columns]
        buffers = _objects(host, sizes)
        keys = self.scheme.object_keys(hashes, None if self.whole else [c.plane for c in self._columns])
        try:
            results = self.client.get_many_into(keys, buffers, strict=False)
        except KVStoreError as exc:
            return LoadResult(len(hashes), 0, 0, time.perf_counter() - start, exc)
        loaded, error = len(refs), None
        for i, (got, buf) in enumerate(zip(results, buffers)):
            if isinstance(got, KVStoreError) or got != len(buf):
                loaded = i // len(sizes)
                error = (
                    got
                    if isinstance(got, KVStoreError)
                    else InvalidArgument(f"stored object is {got} bytes, the cache's is {len(buf)}: the layout differs")
                )
                break
        if loaded:
            self.copies.scatter(host, self._scatter_parts(ids[:loaded]), after)
        return LoadResult(len(hashes), loaded, loaded * self.block_nbytes, time.perf_counter() - start, error)

    def _scatter_parts(self, ids: torch.Tensor) -> list[ScatterPart]:
        parts, offset = [], 0
        for c in self._columns:
            rows = (ids[:, c.slot] != NULL_BLOCK).nonzero().flatten()
            parts.append(ScatterPart(self.planes[c.group][c.plane], rows, ids[rows, c.slot], offset, c.nbytes))
            offset += c.nbytes
        return parts


def _objects(rows: torch.Tensor, sizes: Sequence[int]) -> list[memoryview]:
    """Each row's objects, in order, as views of the host rows."""
    flat = rows.reshape(-1).numpy().data
    out, pos = [], 0
    for _ in range(rows.shape[0]):
        for n in sizes:
            out.append(flat[pos : pos + n])
            pos += n
    return out
