"""The metadata service's own cost of a policy: a trace driven through an in-process MetaStore
(no daemon, no network; the writer's receipts made as a daemon would), as the replay drives a
store: per request one match_prefix, one Get of the held prefix (its read leases handed back),
one PutStart + PutEnd of the rest. Reports the hit rate the store's own eviction reached and the
process CPU per block put (PutStart + PutEnd, with the evictions they cause). Its clock runs at
the replay's pace (PACE requests a second; freed space comes back once the grants that reach it
expire) and the upkeep ticks every TICK_S, as the service's does.

    python -m kvstore.bench.trace.storecost TRACE.jsonl --eviction arc --capacity 3M [--high 1.0 --low 0.999]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.bench.trace.format import Request, read_trace
from kvstore.bench.trace.sizing import blocks_of, parse_tokens
from kvstore.clock import FakeClock
from kvstore.config import MetaConfig
from kvstore.grant import GrantSigner
from kvstore.meta.store import MetaStore
from kvstore.results import PutWritten
from kvstore.types import Endpoint, SegmentInfo, Tier

BLOCK_BYTES = 4096
PACE = 130.0  # requests a second, as `kvstore bench trace` replays here
TICK_S = 0.5
_SIGNER = GrantSigner(b"c" * 16)


@dataclass(frozen=True)
class Cost:
    hit_rate: float
    puts: int  # blocks put
    put_cpu_s: float  # process CPU inside PutStart + PutEnd
    evictions: int

    @property
    def us_per_put(self) -> float:
        return 1e6 * self.put_cpu_s / max(1, self.puts)


def run(requests: Sequence[Request], blocks: int, eviction: str, high: float = 0.95, low: float = 0.85) -> Cost:
    config = MetaConfig(eviction=eviction, high_watermark=high, low_watermark=low, lease_ttl_s=5.0)
    clock = FakeClock()
    store = MetaStore(config, _SIGNER, clock)
    # The bench's daemon is on the client's host: its grants are LOCAL (shm), as here.
    endpoints = (Endpoint("tcp", "127.0.0.1:1"), Endpoint("shm", "h|1|/dev/shm/none"))
    store.mount_segment(SegmentInfo("s", "d", Tier.DRAM, blocks * BLOCK_BYTES, endpoints, "h"))
    cpu = time.process_time
    hit_tokens = put_cpu = 0.0
    puts = 0
    next_tick = TICK_S
    for i, request in enumerate(requests):
        clock.advance(1 / PACE)
        if i / PACE >= next_tick:
            store.heartbeat("d", ["s"])
            store.tick()
            next_tick += TICK_S
        keys = [str(h) for h in request.hash_ids]
        held = store.match_prefix(keys)
        if held:
            results = store.get(keys[:held], client_host="h").results
            store.release([r.lease_id for r in results if r.lease_id])
        hit_tokens += request.tokens_in(held)
        rest = keys[held:]
        if rest:
            t0 = cpu()
            started = store.put_start(rest, [BLOCK_BYTES] * len(rest), client_host="h").results
            ok = [(k, r) for k, r in zip(rest, started, strict=True) if not r.code]
            written = [PutWritten(0, tuple(_SIGNER.receipt(g) for g in r.grants)) for _, r in ok]
            store.put_end([k for k, _ in ok], [1] * len(ok), written)
            put_cpu += cpu() - t0
            puts += len(ok)
    prompt = sum(r.input_length for r in requests)
    return Cost(hit_tokens / max(1, prompt), puts, put_cpu, store.stats().evictions)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvstore.bench.trace.storecost")
    parser.add_argument("trace")
    parser.add_argument("--eviction", default="lru")
    parser.add_argument("--capacity", default="3M")
    parser.add_argument("--high", type=float, default=0.95)
    parser.add_argument("--low", type=float, default=0.85)
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args(argv)
    requests = read_trace(args.trace, args.limit)
    for text in args.capacity.split(","):
        cost = run(requests, blocks_of(parse_tokens(text)), args.eviction, args.high, args.low)
        print(
            f"{args.trace.rsplit('/', 1)[-1]} {text} {args.eviction} high={args.high} low={args.low}: "
            f"hit {100 * cost.hit_rate:.2f} %, {cost.puts} puts, {cost.us_per_put:.1f} us CPU a put, "
            f"{cost.evictions} evictions"
        )


if __name__ == "__main__":
    main()
