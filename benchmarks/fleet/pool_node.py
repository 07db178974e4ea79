"""One prefill node of the pool replay on a fleet (pool_fleet.py), run on its own host: it holds
the node's KVClient and does the node's store calls, told what to do one JSON line at a time on
stdin and answering one JSON line on stdout. Loads land in its own buffers and are checked
against BlockValues' patterns here, so no KV crosses back to the replay.

    {"op": "lookup", "keys": [...], "describe": bool}  -> {"count": N, "daemons": [...]}
    {"op": "serve", "ids": [...], "hit": H, "describe": bool}
        -> {"loaded": L, "daemons": [...], "stored": S, "bad": B, "error": "..."}
    {"op": "evictions"}                                 -> {"evictions": E}
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from kvstore.bench.trace.replay import BlockValues
from kvstore.client import KVClient
from kvstore.errors import KVStoreError

READY = "pool node ready"


def keys_of(ids: Sequence[int]) -> list[str]:
    return [f"pool/{h}" for h in ids]


def daemons(client: KVClient, keys: Sequence[str]) -> list[str]:
    """The daemon of each key's first replica ("" for a key no longer stored)."""
    return [i.replicas[0].daemon_id if i.replicas else "" for i in client.describe(keys)] if keys else []


def serve(client: KVClient, values: BlockValues, ids: list[int], hit: int, describe: bool) -> dict[str, Any]:
    keys = keys_of(ids)
    read = daemons(client, keys[:hit]) if hit and describe else []
    loaded = 0
    if hit:
        results = client.get_many_into(keys[:hit], values.buffers(hit), strict=False)
        while loaded < len(results) and not isinstance(results[loaded], KVStoreError):
            loaded += 1
    bad = values.bad_loads(ids[:loaded])
    stored, error = 0, ""
    if loaded < len(ids):
        try:
            stored = sum(client.put_many(keys[loaded:], values.values(ids[loaded:])))
        except KVStoreError as exc:  # e.g. NoSpace: counted by the replay, which goes on
            error = f"{type(exc).__name__}: {exc}"
    return {"loaded": loaded, "daemons": read[:loaded], "stored": stored, "bad": bad, "error": error}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet.pool_node")
    p.add_argument("--meta", required=True)
    p.add_argument("--block-bytes", type=int, required=True)
    p.add_argument("--max-blocks", type=int, required=True)
    args = p.parse_args(argv)
    values = BlockValues(args.block_bytes, args.max_blocks)
    with KVClient(args.meta) as client:
        print(READY, flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "lookup":
                keys = cmd["keys"]
                count = client.match_prefix(keys)
                reply: dict[str, Any] = {
                    "count": count,
                    "daemons": daemons(client, keys[:count]) if cmd["describe"] else [],
                }
            elif cmd["op"] == "serve":
                reply = serve(client, values, cmd["ids"], cmd["hit"], cmd["describe"])
            else:
                reply = {"evictions": client.stats().evictions}
            print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
