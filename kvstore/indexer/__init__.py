"""The KV indexer: which prefix of a prompt is cached where, answered over HTTP in the
conventions of Mooncake's KV indexer ("Conductor", which Dynamo's standalone indexer follows).
docs/indexer.md is the contract.

    media.py         the medium names (GPU, CPU, DISK) and the bit each gets
    table.py         HashTable: block hash -> the media holding it; longest prefix per medium
    store_table.py   the store's own blocks, per key namespace, fed by kvstore's block feed
    engine_cache.py  one engine's blocks, from its vLLM KV events, re-hashed from their tokens
    registry.py      the publishers POST /register'ed, each consumed by an EventSubscriber
    api.py           the HTTP routes on the admin face
"""
