"""KVBlockCodec against the real store (both granularities) and against an in-memory one."""

import pytest
import torch

from kvstore.client import KVClient
from kvstore.engines.codec import KVBlockCodec, SchemeMismatch, layout_name
from kvstore.engines.keys import Granularity, KeyScheme
from tests.engines.fakes import MemoryStore

BLOCKS, LAYERS = 12, 3


def planes(seed: int | None) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed or 0)
    make = (
        (lambda: torch.randn(BLOCKS, 2, 4, 2, 8, generator=gen))
        if seed is not None
        else (lambda: torch.zeros(BLOCKS, 2, 4, 2, 8))
    )
    return [make() for _ in range(LAYERS)]


def codec_pair(store, granularity: Granularity, tenant: str = "t"):
    src, dst = planes(1), planes(None)
    scheme = KeyScheme(model="m", layout=layout_name(src, granularity), block_size=4, tenant=tenant)
    return KVBlockCodec(store, scheme, src, granularity), KVBlockCodec(store, scheme, dst, granularity)


@pytest.fixture(scope="module")
def store():
    from tests.cluster import Cluster

    cluster = Cluster()
    _, address = cluster.serve("128MiB")
    with KVClient(address) as client:
        yield client
    cluster.close()


@pytest.mark.parametrize("granularity", list(Granularity))
def test_round_trip_through_the_store(store, granularity):
    saver, loader = codec_pair(store, granularity, tenant=f"rt-{granularity.value}")
    saver.check_scheme()
    hashes = saver.scheme.block_hashes(list(range(4 * 5)))
    src_ids, dst_ids = [3, 0, 7, 1, 9], [2, 4, 6, 8, 10]
    assert loader.cached_blocks(hashes) == 0
    saved = saver.save(hashes, src_ids)
    assert (saved.blocks_written, saved.error) == (5, None)
    assert saved.nbytes == 5 * saver.block_nbytes
    again = saver.save(hashes, src_ids)
    assert (again.blocks_written, again.blocks_present) == (0, 5)  # content addressed: kept
    assert loader.cached_blocks(hashes) == 5
    loaded = loader.load(hashes, dst_ids)
    assert loaded.complete and loaded.error is None and loaded.nbytes == saved.nbytes
    for s, d in zip(saver.planes, loader.planes):
        assert torch.equal(s[src_ids], d[dst_ids])
        assert not d[[0, 1, 3]].any()  # nothing else was touched


def test_layer_by_layer_save_and_load(store):
    saver, loader = codec_pair(store, Granularity.LAYER, tenant="by-layer")
    hashes = saver.scheme.block_hashes(list(range(8)))
    for layer in range(LAYERS - 1):
        saver.save(hashes, [0, 1], layers=[layer])
    assert loader.cached_blocks(hashes) == 0  # a block is cached only whole
    saver.save(hashes, [0, 1], layers=[LAYERS - 1])
    assert loader.cached_blocks(hashes) == 2
    assert loader.load(hashes, [5, 6], layers=[1]).complete
    assert torch.equal(loader.planes[1][[5, 6]], saver.planes[1][[0, 1]])
    assert not loader.planes[0][[5, 6]].any()


@pytest.mark.parametrize("granularity", list(Granularity))
def test_a_failed_block_ends_the_usable_prefix(granularity):
    mem = MemoryStore()
    saver, loader = codec_pair(mem, granularity)
    hashes = saver.scheme.block_hashes(list(range(16)))
    saver.save(hashes, [0, 1, 2, 3])
    part = None if granularity is Granularity.BLOCK else 1
    mem.fail_keys.add(saver.scheme.key(hashes[2], part))
    result = loader.load(hashes, [4, 5, 6, 7])
    assert (result.blocks_loaded, result.complete) == (2, False)
    assert "injected" in str(result.error)
    del mem.objects[saver.scheme.key(hashes[1], part)]
    assert loader.load(hashes, [4, 5, 6, 7]).blocks_loaded == 1
    assert loader.cached_blocks(hashes) == 1


def test_a_different_scheme_in_the_same_namespace_is_refused():
    mem = MemoryStore()
    src = planes(1)
    KVBlockCodec(mem, KeyScheme(model="m", layout="l", block_size=4, seed=1), src).check_scheme()
    KVBlockCodec(mem, KeyScheme(model="m", layout="l", block_size=4, seed=1), src).check_scheme()
    with pytest.raises(SchemeMismatch):
        KVBlockCodec(mem, KeyScheme(model="m", layout="l", block_size=4, seed=2), src).check_scheme()


def test_wrong_sized_objects_are_not_loaded():
    mem = MemoryStore()
    saver, loader = codec_pair(mem, Granularity.BLOCK)
    hashes = saver.scheme.block_hashes(list(range(8)))
    mem.objects[saver.scheme.key(hashes[0])] = b"x" * 10
    result = loader.load(hashes[:1], [0])
    assert result.blocks_loaded == 0 and "layout" in str(result.error)
