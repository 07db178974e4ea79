"""kvstore as SGLang's HiCache storage backend, over a real kvstore.

SGLang cannot be installed whole on a CPU machine. scripts/install_vllm.sh unpacks its wheel
without dependencies; its package `__init__` pulls in CUDA-era modules, but `HiCacheStorage` and
the backend factory import with torch alone once that `__init__` is bypassed, so these tests run
against SGLang's real base class and load the backend through SGLang's own "dynamic" factory.
Without the unpacked wheel they run against the backend's stand-in base (same methods) and say so.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SGLANG_DIR = Path(os.environ.get("KVSTORE_SGLANG_DIR", REPO / ".venv/opt/sglang-0.5.23"))


@pytest.fixture(scope="module")
def sglang():
    """(kvstore.engines.sglang, SGLang's hicache_storage module or None)."""
    added = []
    real = None
    if importlib.util.find_spec("sglang") is None and (SGLANG_DIR / "sglang").is_dir():
        sys.path.insert(0, str(SGLANG_DIR))
        spec = importlib.util.find_spec("sglang")
        assert spec is not None and spec.submodule_search_locations is not None
        pkg = types.ModuleType("sglang")  # the package, without its heavy __init__
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["sglang"] = pkg
        added.append(str(SGLANG_DIR))
    try:
        real = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    except ImportError:
        real = None
    _forget("kvstore.engines.sglang")  # bound to whichever base imported last
    backend = importlib.import_module("kvstore.engines.sglang")
    yield backend, real
    _forget("kvstore.engines.sglang")
    _forget("sglang")
    for path in added:
        sys.path.remove(path)


def _forget(package):
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


class HostPool:
    """A host KV pool laid out as SGLang's MHA host pool with layout "page_first":
    kv_buffer[2, tokens, layers, heads, dim], a page's K (and V) one contiguous region."""

    def __init__(self, tokens=64, page_size=16, layers=2, heads=2, dim=8, dtype=torch.float16):
        self.size, self.page_size, self.layer_num, self.head_num, self.head_dim = tokens, page_size, layers, heads, dim
        self.dtype, self.layout = dtype, "page_first"
        self.kv_buffer = torch.zeros(2, tokens, layers, heads, dim, dtype=dtype)

    def get_page_buffer_meta(self, indices):
        item = self.dtype.itemsize
        token = self.layer_num * self.head_num * self.head_dim * item
        v_offset = self.size * token
        ptrs, sizes = [], []
        for start in indices.tolist()[:: self.page_size]:
            k = self.kv_buffer.data_ptr() + start * token
            ptrs += [k, k + v_offset]
            sizes += [token * self.page_size] * 2
        return ptrs, sizes

    def page(self, start):
        return self.kv_buffer[:, start : start + self.page_size]

    def get_dummy_flat_data_page(self):
        return torch.zeros(2 * self.page_size * self.layer_num * self.head_num * self.head_dim, dtype=self.dtype)

    def get_data_page(self, index, flat=True):
        return self.page(index).flatten()

    def set_from_flat_data_page(self, index, data_page):
        self.page(index).copy_(data_page.view(self.page(index).shape))


def _config(meta, tp_rank=0, v1=True, fields=None, **extra):
    """SGLang's HiCacheStorageConfig (`fields` overrides its fields); `extra` goes to extra_config."""
    fields = {
        "tp_rank": tp_rank,
        "tp_size": 2,
        "pp_rank": 0,
        "pp_size": 1,
        "attn_cp_rank": 0,
        "attn_cp_size": 1,
        "is_mla_model": False,
        "enable_storage_metrics": False,
        "is_page_first_layout": True,
        "model_name": "org/tiny-model",
        "extra_config": {
            "backend_name": "kvstore",
            "module_path": "kvstore.engines.sglang",
            "class_name": "KVStoreHiCacheStorage",
            "interface_v1": int(v1),
            "meta": meta,
            **extra,
        },
        **(fields or {}),
    }
    try:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

        return HiCacheStorageConfig(**fields)
    except ImportError:
        return types.SimpleNamespace(**fields)


def _backend(sglang, meta, pool, **kw):
    """Built the way SGLang builds a dynamic backend: through its factory when it imports."""
    backend_mod, real = sglang
    if real is not None:
        from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

        store = StorageBackendFactory.create_backend("dynamic", _config(meta, **kw), pool)
    else:
        store = backend_mod.KVStoreHiCacheStorage(_config(meta, **kw), {})
    store.register_mem_pool_host(pool)
    return store


def test_subclasses_sglangs_own_base_when_it_imports(sglang):
    backend_mod, real = sglang
    if real is None:
        pytest.skip(
            f"SGLang's wheel is not unpacked at {SGLANG_DIR} (scripts/install_vllm.sh): "
            "the other tests ran against the stand-in base"
        )
    assert backend_mod.SGLANG_BASE
    assert issubclass(backend_mod.KVStoreHiCacheStorage, real.HiCacheStorage)


def test_zero_copy_pages_round_trip(sglang, cluster):
    _, meta = cluster.serve("64MiB")
    src, dst = HostPool(), HostPool()
    src.kv_buffer.normal_()
    a = _backend(sglang, meta, src)
    assert a.batch_set_v1(["h1", "h2"], torch.arange(0, 32)) == [True, True]
    assert a.batch_set_v1(["h1"], torch.arange(0, 16)) == [True]  # a stored page is kept
    assert a.batch_exists(["h1", "h2", "h3"]) == 2 and a.exists("h2") and not a.exists("h3")
    b = _backend(sglang, meta, dst)
    assert b.batch_get_v1(["h1", "h2", "h3"], torch.arange(16, 64)) == [True, True, False]
    assert torch.equal(dst.kv_buffer[:, 16:48], src.kv_buffer[:, 0:32])
    assert not dst.kv_buffer[:, 48:].any()
    a.close(), b.close()


def test_flat_pages_round_trip(sglang, cluster):
    _, meta = cluster.serve("64MiB")
    src = HostPool()
    src.kv_buffer.normal_()
    store = _backend(sglang, meta, src, v1=False)
    assert store.set("p1", src.get_data_page(0)) and store.batch_set(
        ["p2", "p3"], [src.get_data_page(16), src.get_data_page(32)]
    )
    assert store.batch_exists(["p1", "p2", "p3", "p4"]) == 3
    got = store.batch_get(["p1", "p4", "p3"], [src.get_dummy_flat_data_page() for _ in range(3)])
    assert torch.equal(got[0], src.get_data_page(0)) and got[1] is None and torch.equal(got[2], src.get_data_page(32))
    assert store.get("p4", src.get_dummy_flat_data_page()) is None
    store.close()


def test_ranks_dtypes_and_interfaces_never_share_pages(sglang, cluster):
    _, meta = cluster.serve("64MiB")
    pool = HostPool()
    store = _backend(sglang, meta, pool)
    assert store.batch_set_v1(["k1", "k2"], torch.arange(0, 32)) == [True, True]
    others = [
        _backend(sglang, meta, HostPool(), tp_rank=1),  # another TP shard
        _backend(sglang, meta, HostPool(dtype=torch.bfloat16)),  # another dtype
        _backend(sglang, meta, HostPool(page_size=32)),  # another page size
        _backend(sglang, meta, HostPool(), v1=False),  # flat objects
    ]
    assert [o.batch_exists(["k1", "k2"]) for o in others] == [0, 0, 0, 0]
    for o in [store, *others]:
        o.close()


def test_store_down_is_a_miss_not_an_error(sglang, cluster):
    proc, meta = cluster.serve("64MiB")
    store = _backend(sglang, meta, HostPool(), timeout_s=1.0)
    proc.kill()
    assert store.batch_exists(["k1"]) == 0
    assert store.batch_get_v1(["k1"], torch.arange(0, 16)) == [False]
    assert store.batch_set_v1(["k1"], torch.arange(0, 16)) == [False]
    store.close()
