"""What a call costs as the store grows, in one process on the metadata store itself (no network),
at 10^4, 10^5 and 10^6 keys of someone else's:

- a put by a tenant at its quota (it evicts one of its own blocks), among another tenant's keys;
- a ListKeys page;
- a DRAM demotion claim by a daemon whose SSD holds the other keys (older than its DRAM's).

Prints min/median/max of 3 rounds per figure.

    python -m benchmarks.keyscale [KEYS ...]
"""

from __future__ import annotations

import statistics
import sys
import time

from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.grant import GrantSigner
from kvstore.meta.store import MetaStore
from kvstore.meta.tenants import Tenant
from kvstore.results import Block, MoveOutcome, PutWritten
from kvstore.types import Endpoint, SegmentInfo, Tier

BLOCK = 64
SSD_BLOCK = 4096  # an SSD block's footprint (its alignment)
DRAM_KEYS = 1000
SIGNER = GrantSigner(b"k" * 16)
ENDPOINTS = (Endpoint("tcp", "127.0.0.1:1"),)


def _store(keys: int) -> tuple[MetaStore, str]:
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(SegmentInfo("s1", "d1", Tier.DRAM, (keys + 10_000) * 4096, ENDPOINTS, "h"))
    big = store.tenants.add(Tenant("big", 0), update=False)
    small = store.tenants.add(Tenant("small", 0, quotas={Tier.DRAM: 8 * BLOCK}), update=False)
    big_ns, small_ns = f"\0{big.id}\0", f"\0{small.id}\0"
    for start in range(0, keys, 1000):
        _put(store, [f"{big_ns}k/{i}" for i in range(start, min(keys, start + 1000))])
    _put(store, [f"{small_ns}s/{i}" for i in range(8)])  # at its quota
    return store, small_ns


def _tiered(keys: int) -> MetaStore:
    """One daemon: `keys` blocks on its SSD (half full), then DRAM_KEYS newer ones filling its DRAM
    (past the high watermark, so its claims demote)."""
    store = MetaStore(MetaConfig(), SIGNER, FakeClock())
    store.mount_segment(SegmentInfo("ssd", "d1", Tier.SSD, 2 * (keys + DRAM_KEYS) * SSD_BLOCK, ENDPOINTS, "h"))
    store.mount_segment(SegmentInfo("dram", "d1", Tier.DRAM, DRAM_KEYS * BLOCK, ENDPOINTS, "h"))
    for start in range(0, keys, 1000):
        blocks = [Block(f"ssd/{i}", i * SSD_BLOCK, BLOCK, 1) for i in range(start, min(keys, start + 1000))]
        store.announce("ssd", blocks)
    _put(store, [f"dram/{i}" for i in range(DRAM_KEYS)])
    return store


def _put(store: MetaStore, keys: list[str]) -> None:
    results = store.put_start(keys, [BLOCK] * len(keys)).results
    written = [PutWritten(0, tuple(SIGNER.receipt(g) for g in r.grants)) for r in results]
    store.put_end(keys, [1] * len(keys), written)


def measure(keys: int, rounds: int = 3, puts: int = 50, claims: int = 20) -> dict[str, list[float]]:
    store, small = _store(keys)
    out: dict[str, list[float]] = {"quota put ms": [], "ListKeys page ms": [], "DRAM demotion ms": []}
    n = 8
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(puts):
            _put(store, [f"{small}s/{n}"])
            n += 1
        out["quota put ms"].append((time.perf_counter() - started) * 1000 / puts)
        started = time.perf_counter()
        cursor, pages = "", 0
        while pages < 20:
            listing = store.list_keys("", 1000, cursor)
            cursor, pages = listing.next_cursor, pages + 1
        out["ListKeys page ms"].append((time.perf_counter() - started) * 1000 / pages)
    del store
    tiered = _tiered(keys)
    for _ in range(rounds):
        spent = 0.0
        for _ in range(claims):
            started = time.perf_counter()
            tasks = tiered.claim_moves("d1", BLOCK)  # one block's demotion
            spent += time.perf_counter() - started
            assert len(tasks) == 1, tasks
            tiered.complete_moves("d1", [MoveOutcome(t.move_id, False, "bench") for t in tasks])  # as it was
        out["DRAM demotion ms"].append(spent * 1000 / claims)
    return out


def main(argv: list[str]) -> None:
    for keys in [int(a) for a in argv] or [10_000, 100_000, 1_000_000]:
        for name, values in measure(keys).items():
            lo, mid, hi = min(values), statistics.median(values), max(values)
            print(f"{keys:>9,} keys  {name:<17} {lo:8.3f} / {mid:8.3f} / {hi:8.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
