"""How a worker reads vLLM's KV cache tensors: block-major planes per layer (per KV cache group for
a hybrid model), and which codec moves them: in place for a CPU cache, through host staging rows for
a CUDA cache or a hybrid model's chunks (staged_codec.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from kvstore.engines.codec import KVBlockCodec, layout_name
from kvstore.engines.keys import Granularity, KeyScheme
from kvstore.engines.vllm.config import ConnectorConfig
from kvstore.engines.vllm.device_copies import DeviceCopies
from kvstore.engines.vllm.groups import GroupLayout
from kvstore.engines.vllm.staged_codec import StagedCodec
from kvstore.errors import InvalidArgument


class UnsupportedCache(InvalidArgument):
    """The KV cache tensors are not laid out as block-major memory this connector can move."""


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
        if t.device.type not in ("cpu", "cuda") or (planes and t.device != planes[0].device):
            raise UnsupportedCache(
                f"layer {name}: the KV cache is on {t.device}; this connector moves CPU and CUDA caches, "
                "all on one device"
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


class CachePlanes(NamedTuple):
    planes: list[torch.Tensor]  # every plane, group by group
    by_group: list[list[torch.Tensor]]  # a hybrid model's planes per group ([planes] otherwise)
    layer_of_plane: list[int]
    layer_of_name: dict[str, int]  # single group: the layer index of each layer name
    layout: str  # the layout tag of the key namespace (dtype, shapes, granularity, groups)


def read_planes(
    kv_caches: dict[str, torch.Tensor], num_blocks: int, groups: GroupLayout | None, granularity: Granularity
) -> CachePlanes:
    """The planes of `kv_caches`; with hybrid `groups`, each group's own (layers of different
    groups may share one tensor: a block id belongs to one group at a time)."""
    if groups is None:
        planes, layer_of_plane, layer_of_name = cache_planes(kv_caches, num_blocks)
        return CachePlanes(planes, [planes], layer_of_plane, layer_of_name, layout_name(planes, granularity))
    by_group = [
        cache_planes({n: kv_caches[n] for n in g.layer_names if n in kv_caches}, num_blocks)[0] for g in groups.groups
    ]
    planes = [p for group in by_group for p in group]
    layout = f"{layout_name(planes, Granularity.BLOCK)}-{groups.tag}"
    return CachePlanes(planes, by_group, list(range(len(planes))), {}, layout)


def open_codec(
    client: Any, scheme: KeyScheme, cache: CachePlanes, groups: GroupLayout | None, config: ConnectorConfig
) -> KVBlockCodec | StagedCodec:
    device = cache.planes[0].device
    if groups is None and device.type == "cpu" and not config.stage_host_caches:
        return KVBlockCodec(client, scheme, cache.planes, config.granularity, cache.layer_of_plane)
    copies = DeviceCopies(device, stand_in=config.stage_host_caches)
    if groups is not None:
        return StagedCodec(client, scheme, groups, cache.by_group, copies)
    single = GroupLayout.single(scheme.block_size)
    return StagedCodec(client, scheme, single, cache.by_group, copies, config.granularity, cache.layer_of_plane)
