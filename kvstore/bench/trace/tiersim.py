"""Two tiers in the simulator: a DRAM cache (LRU) whose least recently used blocks are demoted to
an SSD cache when the SSD tier admits them, with the store's own SSD policies driven as the store
drives them: its admission (kvstore.meta.admission) and its eviction, LRU or the store's ARC
(one ARCEviction hearing of every block, as the index's watcher does, asked for victims among the
SSD's blocks only). A block read `promote_after` times on SSD comes back to DRAM, as the store's
promotion does (MetaConfig.promote_after_hits).

    python -m kvstore.bench.trace.tiersim TRACE.jsonl [...] [--dram 1M] [--ssd 3M,10M]

prints, per SSD policy (eviction / admission), the hit rate (DRAM and SSD together), the SSD's
block writes and reads, and both against lru / all (today's behaviour).
"""

from __future__ import annotations

import argparse
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.bench.trace.arcsim import _Block
from kvstore.bench.trace.format import Request, read_trace
from kvstore.bench.trace.sim import simulate
from kvstore.bench.trace.sizing import blocks_of, parse_tokens
from kvstore.meta.admission import AdmitReused, make_admission
from kvstore.meta.eviction_arc import ARCEviction

SSD_POLICIES = (("lru", "all"), ("lru", "reused"), ("arc", "all"), ("arc", "reused"))


class _OnSsd:
    """The scope of an SSD eviction: the SSD's blocks, least recently used first."""

    def __init__(self, ssd: OrderedDict[str, None]) -> None:
        self._ssd = ssd

    def least_recent(self) -> Iterator[tuple[str, Any]]:
        return ((k, _Block) for k in self._ssd)

    def entry(self, key: str) -> Any:
        return _Block if key in self._ssd else None


class TwoTiers:
    """A PrefixCache of DRAM (LRU) over SSD (exclusive: a block is in one of them)."""

    def __init__(
        self, dram_blocks: int, ssd_blocks: int, admission: str, ssd_eviction: str = "lru", promote_after: int = 2
    ) -> None:
        self.dram_blocks, self.ssd_blocks, self.promote_after = dram_blocks, ssd_blocks, promote_after
        self.admission = make_admission(admission)
        self.arc = ARCEviction() if ssd_eviction == "arc" else None
        self._dram: OrderedDict[str, None] = OrderedDict()
        self._ssd: OrderedDict[str, None] = OrderedDict()
        self._ssd_reads: Counter[str] = Counter()
        self.evictions = 0  # blocks gone from both tiers
        self.ssd_writes = 0  # demotions landed on SSD
        self.ssd_hits = 0  # blocks read from SSD

    def _heard(self, hook: str, block: str) -> None:
        """What the store's index tells its watchers."""
        for watcher in (self.admission, self.arc):
            if isinstance(watcher, AdmitReused | ARCEviction):
                getattr(watcher, hook)(block)

    def match(self, blocks: Sequence[Hashable]) -> int:
        n = 0
        for block in map(str, blocks):
            if block not in self._dram and block not in self._ssd:
                break
            n += 1
        return n

    def load(self, blocks: Sequence[Hashable]) -> None:
        """Read the blocks; those read often enough on SSD come back to DRAM once all are read
        (the store's promotion is a later move, and a reader's lease keeps its blocks in place)."""
        hot = []
        for block in map(str, blocks):
            self._heard("used", block)
            if block in self._dram:
                self._dram.move_to_end(block)
                continue
            self.ssd_hits += 1
            self._ssd.move_to_end(block)
            self._ssd_reads[block] += 1
            if self._ssd_reads[block] >= self.promote_after:
                hot.append(block)
        for block in hot:
            if block in self._ssd:
                del self._ssd[block], self._ssd_reads[block]
                self._into_dram(block)

    def store(self, blocks: Sequence[Hashable]) -> None:
        for block in map(str, blocks):
            if block in self._dram or block in self._ssd:
                continue
            self._heard("added", block)
            self._into_dram(block)

    def _into_dram(self, block: str) -> None:
        self._dram[block] = None
        while len(self._dram) > self.dram_blocks:
            victim, _ = self._dram.popitem(last=False)
            if self.ssd_blocks and self.admission.admits(victim):
                self._into_ssd(victim)
            else:
                self._gone(victim)

    def _into_ssd(self, block: str) -> None:
        self._ssd[block] = None
        self.ssd_writes += 1
        while len(self._ssd) > self.ssd_blocks:
            victim = self._ssd_victim()
            del self._ssd[victim]
            self._ssd_reads.pop(victim, None)
            self._gone(victim)

    def _ssd_victim(self) -> str:
        if self.arc is not None:
            for victim in self.arc.victims(_OnSsd(self._ssd), _never, 1):
                return victim
        return next(iter(self._ssd))

    def _gone(self, block: str) -> None:
        self.evictions += 1
        self._heard("removed", block)

    def __len__(self) -> int:
        return len(self._dram) + len(self._ssd)


@dataclass(frozen=True)
class TierRun:
    hit_rate: float
    ssd_writes: int
    ssd_hits: int


def _never(key: str) -> bool:
    return False


def run(requests: Sequence[Request], dram_tokens: int, ssd_tokens: int, eviction: str, admission: str) -> TierRun:
    cache = TwoTiers(blocks_of(dram_tokens), blocks_of(ssd_tokens), admission, eviction)
    result = simulate(requests, cache)
    prompt = max(1, sum(r.input_length for r in requests))
    return TierRun(result.total_hit_tokens / prompt, cache.ssd_writes, cache.ssd_hits)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m kvstore.bench.trace.tiersim")
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--dram", default="1M", help="DRAM capacity in tokens")
    parser.add_argument("--ssd", default="3M,10M", help="SSD capacities in tokens, comma-separated")
    args = parser.parse_args(argv)
    print("| trace | DRAM | SSD | SSD policy | hit rate | ÷ lru/all | SSD writes | ÷ lru/all | SSD reads per write |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in args.traces:
        requests = read_trace(path)
        trace = Path(path).name.removesuffix(".jsonl").removesuffix("_trace")
        dram = parse_tokens(args.dram)
        alone = run(requests, dram, 0, "lru", "all")
        print(f"| {trace} | {args.dram} | none | - | {100 * alone.hit_rate:.1f} % | | | | |")
        for ssd_text in args.ssd.split(","):
            runs = {f"{e} / {a}": run(requests, dram, parse_tokens(ssd_text), e, a) for e, a in SSD_POLICIES}
            base = runs["lru / all"]
            for name, r in runs.items():
                print(
                    f"| {trace} | {args.dram} | {ssd_text} | {name} | {100 * r.hit_rate:.1f} % "
                    f"| {r.hit_rate / base.hit_rate if base.hit_rate else 0:.3f} | {r.ssd_writes} "
                    f"| {r.ssd_writes / base.ssd_writes if base.ssd_writes else 0:.3f} "
                    f"| {r.ssd_hits / r.ssd_writes if r.ssd_writes else 0:.2f} |"
                )


if __name__ == "__main__":
    main()
