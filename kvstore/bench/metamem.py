"""Metadata memory per block: how much a MetaStore's resident memory grows per block it holds.

Measured in a fresh process (`python -m kvstore.bench.metamem BLOCKS`, which prints one JSON
line) so nothing else in the bench shares its heap. RSS comes from /proc/self/statm: tracemalloc
would be exact but is far too slow at a million blocks. Keys, sizes and checksums are built as
distinct objects, as a server decoding them from requests would hold them. The blocks are put as
a shm writer on the daemons' host puts them (LOCAL grants, no receipts): what a block costs while
it is stored, not the seconds-long state of a put in flight.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from array import array
from dataclasses import asdict

from kvstore.bench.latency import KEY_FORMAT
from kvstore.bench.results import MetaMemory

BLOCK_SIZE = 64 << 10
BATCH = 1000
SEGMENTS = 4
_PAGE = os.sysconf("SC_PAGE_SIZE")
HOST = "bench-host"
_MIX = 0x9E3779B97F4A7C15  # spreads checksums over 64 bits, like real xxh3 values


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE


def measure(blocks: int) -> MetaMemory:
    """Put (put_start + put_end) `blocks` realistic keys into a fresh MetaStore, in batches of
    BATCH, and return its RSS growth."""
    from kvstore.clock import FakeClock
    from kvstore.config import MetaConfig
    from kvstore.grant import GrantSigner
    from kvstore.meta.store import MetaStore
    from kvstore.types import Endpoint, SegmentInfo, Tier

    store = MetaStore(MetaConfig(), GrantSigner(b"k" * 16), FakeClock())
    # Room for every block with the fill well under the eviction watermark.
    capacity = max(BLOCK_SIZE * 16, blocks * BLOCK_SIZE * 2 // SEGMENTS)
    # The writer is on the daemons' host and writes over shm: its grants are LOCAL and its puts need
    # no receipts. (A daemon-checked grant put without a receipt would keep a grant horizon, a
    # float in a dict, for the grant's lifetime, seconds: not what a block costs while stored.)
    endpoints = (Endpoint("shm", f"{HOST}|1|/dev/shm/bench"), Endpoint("tcp", "127.0.0.1:9000"))
    for i in range(SEGMENTS):
        store.mount_segment(SegmentInfo(f"bench-seg-{i}", f"bench-daemon-{i}", Tier.DRAM, capacity, endpoints, HOST))
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    for start in range(0, blocks, BATCH):
        stop = min(blocks, start + BATCH)
        keys = [KEY_FORMAT.format(i) for i in range(start, stop)]
        store.put_start(keys, array("q", [BLOCK_SIZE] * len(keys)).tolist(), client_host=HOST)
        checksums = array("Q", [(i * _MIX) & (2**64 - 1) for i in range(start, stop)]).tolist()
        store.put_end(keys, checksums, unchecked_ok=True)  # LOCAL grants: no receipts to hand in
    seconds = time.perf_counter() - t0
    gc.collect()
    stored = store.stats().keys
    if stored != blocks:
        raise AssertionError(f"{stored} of {blocks} blocks stored")
    return MetaMemory(blocks, rss_bytes() - before, seconds)


def measure_in_subprocess(blocks: int, timeout: float = 600.0) -> MetaMemory:
    out = subprocess.run(
        [sys.executable, "-m", "kvstore.bench.metamem", str(blocks)], capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise RuntimeError(f"metadata memory measurement failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return MetaMemory(**json.loads(out.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m kvstore.bench.metamem BLOCKS")
    print(json.dumps(asdict(measure(int(sys.argv[1])))))
