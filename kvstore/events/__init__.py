"""KV events: what the metadata service tells the world about the blocks it holds, in vLLM's
format, so consumers written for vLLM's events (Dynamo's and llm-d's indexers, Mooncake's
Conductor, kvstore's router) consume kvstore's too. docs/kv-events.md is the contract.

    MetaState --(under the store's lock)--> EventBuffer          records, nothing else
                                                │ drained by
                                             BlockFeed thread    per-block copy counts: a block
                                                │                enters or leaves a tier once
                              ┌─────────────────┼──────────────────┐
                         ZmqPublisher      the indexer's table   (any FeedListener)
                   PUB (topic, seq, EventBatch) + ROUTER replay

block_ids.py maps a store key to the block it names and the 64-bit hash events carry; wire.py is the
msgpack format (encode for the publisher, decode for subscriber.py, which the router and the
indexer use to read vLLM's own events); llmd.py is the form llm-d's indexer reads (a pool topic per
model, positional events), which the publisher sends instead when given a pool name.
"""
