"""Peer stores `kvstore bench --compare` measures beside kvstore, in the same run, with the same
loops (kvstore.bench.store and .latency) through an adapter for each:

    mooncake   Mooncake Store: mooncake_master + a server + a client process (peers/mooncake.py)
    redis      a redis-server the bench starts on a free port, through redis-py (peers/redis.py)

This package is the plug-in kvstore.bench.plugin loads by name (kvstore itself never imports it):
importing it registers each peer, by the name of its module (imported only when that peer is
measured), and the report of kvstore beside them (benchmarks.compare). What a peer module offers,
what it is given and what it gives back: kvstore.bench.plugin.
"""

from __future__ import annotations

from benchmarks import compare
from kvstore.bench import plugin

PEERS = {"mooncake": "benchmarks.peers.mooncake", "redis": "benchmarks.peers.redis"}

for _name, _module in PEERS.items():
    plugin.register_peer(_name, _module)
plugin.register_comparison(plugin.Comparison(render=compare.render_comparison, document=compare.document))
