"""SGLang's own Mooncake HiCache backend (sglang/srt/mem_cache/storage/mooncake_store/
mooncake_store.py, unchanged), built by SGLang's StorageBackendFactory as `--hicache-storage-backend
mooncake` builds it, in a process of its own:

    python -m kvstore.compat.mooncake.run tests/compat/sglang_mooncake_driver.py write|read META

`write` fills host KV pools with seeded random pages and backs them up (batch_set_v1); `read`,
in another process, prefetches them into empty pools (batch_get_v1) and compares with the same
seeded pages. Two layouts: MHA "page_first" (one buffer per key: batch_put_from /
batch_get_into) and MLA "layer_first" (one buffer per layer: the *_multi_buffers calls).
Prints `RESULT {json}`.

SGLang cannot be installed whole on a CPU machine (scripts/install_vllm.sh unpacks its wheel
without dependencies). Three modules the backend imports names from do not import here:
sglang.srt.mem_cache.pool_host (and .mla) import Triton GPU kernels at module level, and
sglang.srt.observability.metrics_collector needs orjson. Stand-ins below give just the names
(HostKVCache, HostTensorAllocator, MLATokenToKVPoolHost, StorageMetrics) — base classes and
isinstance targets the CPU path never exercises; the host pools are the test's own, built as
SGLang lays them out. Everything else is SGLang's code.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
SGLANG_DIR = Path(os.environ.get("KVSTORE_SGLANG_DIR", REPO / ".venv/opt/sglang-0.5.23"))
PAGE, TOKENS, LAYERS, HEADS, DIM = 16, 64, 3, 2, 8
KEYS = [f"page-{i}" for i in range(TOKENS // PAGE)]
STOOD_IN: dict[str, str] = {}


def import_sglang() -> None:
    """SGLang's package without its CUDA-era __init__ (as tests/vllm/test_sglang_backend.py)."""
    sys.path.insert(0, str(SGLANG_DIR))
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations is not None
    pkg = types.ModuleType("sglang")
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    sys.modules["sglang"] = pkg
    for name, names in [
        ("sglang.srt.mem_cache.pool_host", _pool_host_names),
        ("sglang.srt.mem_cache.pool_host.mla", _mla_names),
        ("sglang.srt.observability.metrics_collector", _metrics_names),
    ]:
        parent = name.rsplit(".", 1)[0]
        try:
            if parent in STOOD_IN:
                raise ImportError(f"its package {parent} is stood in")
            importlib.import_module(name)
        except ImportError as exc:
            STOOD_IN[name] = f"{type(exc).__name__}: {exc}"
            module = types.ModuleType(name)
            module.__dict__.update(names())
            module.__path__ = []
            sys.modules[name] = module


def _pool_host_names() -> dict[str, Any]:
    class HostKVCache:
        pass

    class HostTensorAllocator:
        pass

    return {"HostKVCache": HostKVCache, "HostTensorAllocator": HostTensorAllocator}


def _mla_names() -> dict[str, Any]:
    class MLATokenToKVPoolHost:
        pass

    return {"MLATokenToKVPoolHost": MLATokenToKVPoolHost}


def _metrics_names() -> dict[str, Any]:
    @dataclasses.dataclass
    class StorageMetrics:
        prefetch_pgs: list[Any] = dataclasses.field(default_factory=list)
        backup_pgs: list[Any] = dataclasses.field(default_factory=list)
        prefetch_bandwidth: list[Any] = dataclasses.field(default_factory=list)
        backup_bandwidth: list[Any] = dataclasses.field(default_factory=list)

    return {"StorageMetrics": StorageMetrics}


class MHAPageFirstPool:
    """kv_buffer[2, tokens, layers, heads, dim]; a page's K (and V) is one contiguous region."""

    layout, page_size, dtype = "page_first", PAGE, torch.float16

    def __init__(self) -> None:
        self.kv_buffer = torch.zeros(2, TOKENS, LAYERS, HEADS, DIM, dtype=self.dtype)

    def get_ksize_per_token(self) -> int:
        return LAYERS * HEADS * DIM * self.dtype.itemsize

    def get_page_buffer_meta(self, indices):
        token, v_offset = self.get_ksize_per_token(), TOKENS * self.get_ksize_per_token()
        ptrs, sizes = [], []
        for start in indices.tolist()[::PAGE]:
            k = self.kv_buffer.data_ptr() + start * token
            ptrs += [k, k + v_offset]
            sizes += [token * PAGE] * 2
        return ptrs, sizes


class MLALayerFirstPool:
    """kv_buffer[layers, tokens, 1, dim]; a page is one region per layer."""

    layout, page_size, dtype = "layer_first", PAGE, torch.bfloat16

    def __init__(self) -> None:
        self.kv_buffer = torch.zeros(LAYERS, TOKENS, 1, DIM * 4, dtype=self.dtype)

    def get_ksize_per_token(self) -> int:
        return LAYERS * DIM * 4 * self.dtype.itemsize

    def get_page_buffer_meta(self, indices):
        token = DIM * 4 * self.dtype.itemsize
        ptrs, sizes = [], []
        for start in indices.tolist()[::PAGE]:
            for layer in range(LAYERS):
                ptrs.append(self.kv_buffer[layer, start].data_ptr())
                sizes.append(token * PAGE)
        return ptrs, sizes


def backend(meta: str, pool, mla: bool):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    config = HiCacheStorageConfig(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=pool.layout == "page_first",
        model_name="org/tiny-model",
        extra_config={
            "master_server_address": meta,
            "protocol": "tcp",
            "device_name": "",
            "global_segment_size": 16 << 20,
            "check_server": False,
        },
    )
    store = StorageBackendFactory.create_backend("mooncake", config, pool)
    store.register_mem_pool_host(pool)
    return store


def pages(pool, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(pool.kv_buffer.shape, generator=generator).to(pool.dtype)


def main(role: str, meta: str) -> dict[str, Any]:
    import_sglang()
    import mooncake.store
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    out: dict[str, Any] = {
        "stood_in": STOOD_IN,
        "mooncake_store_module": mooncake.store.MooncakeDistributedStore.__module__,
        "backend_class": f"{MooncakeStore.__module__}.{MooncakeStore.__name__}",
    }
    stores = {}
    layouts: list[tuple[str, type[MHAPageFirstPool | MLALayerFirstPool], bool, int]] = [
        ("mha", MHAPageFirstPool, False, 1),
        ("mla", MLALayerFirstPool, True, 2),
    ]
    for name, pool_cls, mla, seed in layouts:
        pool = pool_cls()
        store = stores[name] = backend(meta, pool, mla)
        out[f"{name}_type"] = type(store).__name__
        everything = torch.arange(0, TOKENS)
        if role == "write":
            pool.kv_buffer.copy_(pages(pool, seed))
            out[f"{name}_set"] = store.batch_set_v1(KEYS[:3], everything[: 3 * PAGE])
            out[f"{name}_set_again"] = store.batch_set_v1(KEYS[:1], everything[:PAGE])
            out[f"{name}_exists"] = store.batch_exists(KEYS)
        else:
            expected = pages(pool, seed)
            out[f"{name}_exists"] = store.batch_exists(KEYS)
            out[f"{name}_get"] = store.batch_get_v1(KEYS, everything)
            # both layouts keep tokens on dimension 1
            out[f"{name}_identical"] = torch.equal(pool.kv_buffer[:, : 3 * PAGE], expected[:, : 3 * PAGE])
            out[f"{name}_miss_untouched"] = not pool.kv_buffer[:, 3 * PAGE :].any()
    if role == "read":  # once both layouts were read: SGLang's clear() is remove_all, every key of the store
        for store in stores.values():  # but those another client still reads (each clear hands its own reads back)
            store.clear()
        for name, store in stores.items():
            out[f"{name}_exists_after_clear"] = store.batch_exists(KEYS)
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], sys.argv[2])), flush=True)
