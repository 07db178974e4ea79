"""The indexer's tables: longest prefix per medium, the store's namespaces, and an engine's blocks
re-hashed from the tokens its vLLM events carry."""

from __future__ import annotations

from kvstore import blockhash
from kvstore.engines.keys import KeyScheme
from kvstore.events import wire
from kvstore.events.block_ids import block_ref
from kvstore.events.feed import Transition
from kvstore.indexer import media
from kvstore.indexer.engine_cache import EngineCache
from kvstore.indexer.store_table import StoreTable
from kvstore.indexer.table import HashTable
from kvstore.types import Tier

GPU, CPU, DISK = (media.bit(m) for m in (media.GPU, media.CPU, media.DISK))


def shorts(digests):
    return [blockhash.short(d) for d in digests]


def test_the_longest_prefix_in_any_medium_and_in_each():
    t = HashTable()
    for h in (1, 2, 3):
        t.add(h, CPU)
    t.add(1, GPU)
    t.add(3, DISK)
    t.add(4, DISK)
    found = t.match([1, 2, 3, 4, 5])
    assert found.blocks == 4  # every one of 1..4 is somewhere
    assert found.by_medium == {"GPU": 1, "CPU": 3}  # DISK holds 3 and 4, but not 1: no prefix
    assert t.match([9, 1]).blocks == 0
    assert t.remove(1, GPU) is False and t.remove(1, CPU) is True and t.match([1]).blocks == 0


def test_media_names_are_conductors():
    assert media.normalize("STORAGE") == media.normalize("disk") == "DISK"
    assert media.normalize("cpu") == media.normalize("CPU_PINNED") == "CPU"
    assert media.normalize(None) == "GPU"
    assert media.normalize("nvme-of") == "NVME-OF"  # new media are kept
    assert media.name(media.bit("NVME-OF")) == "NVME-OF"


def test_the_store_table_keeps_namespaces_apart():
    a = KeyScheme(model="m", layout="bf16", block_size=4)
    b = KeyScheme(model="m", layout="fp8", block_size=4)
    other_model = KeyScheme(model="n", layout="bf16", block_size=4)
    tokens = list(range(16))
    table = StoreTable()

    def store(scheme, n, tier=Tier.DRAM, stored=True):
        keys = scheme.block_keys(tokens)[:n]
        table.changed([Transition(stored, block_ref(k), tier) for k in keys])

    store(a, 2)
    store(b, 3, Tier.SSD)
    store(other_model, 4)
    table.changed([Transition(True, block_ref("not/an/engine/key"), Tier.DRAM)])
    chain = shorts(blockhash.chain(tokens, 4))
    best = table.match("default", "m", chain)
    assert (best.blocks, best.by_medium) == (3, {"DISK": 3})  # the best layout, not a mix of layouts
    assert table.match("default", "m", chain, layout="bf16").by_medium == {"CPU": 2}
    assert table.match("other-tenant", "m", chain).blocks == 0
    store(b, 3, Tier.SSD, stored=False)
    assert table.match("default", "m", chain).by_medium == {"CPU": 2}
    assert len(table) == 2 + 4
    table.cleared()
    assert len(table) == 0


def stored(hashes, parent, tokens, medium="GPU", block_size=4, lora=None):
    return wire.Stored(hashes, parent, tokens, block_size, medium, lora)


def test_an_engines_blocks_are_placed_by_their_tokens_and_parents():
    cache = EngineCache(block_size=4)
    tokens = list(range(100, 116))
    # vLLM's own hashes are opaque here (101, 102, ...): only tokens and parents matter.
    cache.batch(1, wire.Batch(0.0, [stored([101, 102], None, tokens[:8])], 0))
    cache.batch(2, wire.Batch(0.0, [stored([103], 102, tokens[8:12])], 0))
    cache.batch(3, wire.Batch(0.0, [stored([999], 55, tokens[12:16])], 0))  # a parent never seen
    chain = shorts(blockhash.chain(tokens, 4))
    assert cache.match(chain).by_medium == {"GPU": 3}
    assert cache.unplaced == 1
    cache.batch(4, wire.Batch(0.0, [stored([101], None, tokens[:4], medium="cpu")], 0))  # an offload copy
    cache.batch(5, wire.Batch(0.0, [wire.Removed([102], "GPU")], 0))
    found = cache.match(chain)
    assert found.blocks == 1 and found.by_medium == {"GPU": 1, "CPU": 1}  # block 2 gone breaks the chain
    cache.batch(6, wire.Batch(0.0, [wire.Cleared()], 0))
    assert len(cache) == 0


def test_lora_and_salt_enter_the_hash_as_the_connector_encodes_them():
    cache = EngineCache(block_size=4, salt="w8a8")
    tokens = list(range(8))
    cache.batch(1, wire.Batch(0.0, [stored([1, 2], None, tokens, lora="sql")], 0))
    assert cache.match(shorts(blockhash.chain(tokens, 4))).blocks == 0
    assert cache.match(shorts(blockhash.chain(tokens, 4, extra=blockhash.extra_key("sql", "w8a8")))).blocks == 2


def test_events_without_tokens_cannot_be_placed():
    cache = EngineCache(block_size=4)
    cache.batch(1, wire.Batch(0.0, [stored([1], None, [])], 0))
    assert len(cache) == 0 and cache.unplaced == 1
    cache.lost()
    assert cache.unplaced == 1
