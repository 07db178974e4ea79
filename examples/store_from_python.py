"""Store KV blocks and read them back from Python.

Run it as:
    python examples/store_from_python.py                    # starts its own `kvstore serve`
    python examples/store_from_python.py --meta HOST:PORT   # uses a running store
"""

import argparse

import numpy as np

from kvstore.client import KeyNotFound, KVClient


def run(meta: str) -> None:
    with KVClient(meta) as kv:
        kv.put("tenant/model/layout/0001", b"some KV bytes")
        kv.put_many(["k/1", "k/2"], [np.ones(1024, np.float16), bytearray(4096)])
        print(kv.get("tenant/model/layout/0001"))
        out = np.empty(1024, np.float16)
        kv.get_into("k/1", out)  # straight into caller memory
        print("k/1 reads back:", bool((out == 1).all()))
        print("cached prefix of [k/1, k/2, k/3]:", kv.match_prefix(["k/1", "k/2", "k/3"]))
        try:
            kv.get("never-written")
        except KeyNotFound as miss:  # a miss: an engine recomputes the block
            print("miss:", miss)
        info = kv.describe(["k/1"])[0]
        print(f"k/1: {info.size} bytes in {[t.value for t in info.tiers]}, {len(info.replicas)} replica(s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta", help="a running store's metadata address")
    args = parser.parse_args()
    if args.meta:
        run(args.meta)
    else:
        from kvstore.engines.launch import Fleet  # starts processes and waits for their readiness lines

        with Fleet() as fleet:
            _, meta = fleet.store("64MiB")
            run(meta)
