"""`kvstore bench --tiers`: the SSD tier's write (demotion) and read throughput, against the raw
disk measured in the same run on the same directory (sequential O_DIRECT and buffered).

Demotion is measured end to end: blocks are put into DRAM with a watermark that demotes every
unleased block at once, and the clock stops when the last one is on SSD. Reads are cold: the
SSD files' pages are dropped from the page cache before every pass.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvstore.bench.disk import DiskCeiling, raw_disk_ceiling
from kvstore.bench.procs import LocalStore
from kvstore.client import KVClient
from kvstore.config import ClientConfig

# Every unleased block is past the high watermark the moment it lands; none is promoted back.
_DEMOTE_ALL = {
    "KVSTORE_META_HIGH_WATERMARK": "1e-12",
    "KVSTORE_META_LOW_WATERMARK": "1e-13",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "1000000000",
    "KVSTORE_META_TICK_INTERVAL_S": "0.05",
}


@dataclass(frozen=True)
class TierResult:
    disk: DiskCeiling
    block: int
    blocks: int
    demote_gbps: float
    read_gbps: dict[str, float]  # transport -> cold SSD read GB/s

    def comparisons(self) -> list[tuple[str, float, str, float]]:
        """(what, GB/s, against, ratio) for the report."""
        rows = []
        for name, ceiling in (("O_DIRECT", self.disk.direct_write_gbps), ("buffered", self.disk.buffered_write_gbps)):
            if ceiling:
                rows.append(
                    (
                        "demotion (SSD write)",
                        self.demote_gbps,
                        f"raw {name} write {ceiling:.2f} GB/s",
                        self.demote_gbps / ceiling,
                    )
                )
        same_file = self.read_gbps.get("raw file")
        for transport, gbps in self.read_gbps.items():
            if transport == "raw file":
                continue
            for name, ceiling in (
                ("O_DIRECT", self.disk.direct_read_gbps),
                ("buffered", self.disk.buffered_read_gbps),
                ("same-file", same_file),
            ):
                if ceiling:
                    rows.append(
                        (f"SSD read via {transport}", gbps, f"raw {name} read {ceiling:.2f} GB/s", gbps / ceiling)
                    )
        return rows


def _drop_cache(ssd_dir: Path) -> None:
    for path in ssd_dir.glob("ssd-*.data"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _best(results: dict[str, float], name: str, value: float) -> None:
    results[name] = max(results.get(name, 0.0), value)


def _tier_read(meta_address: str, transport: str, keys: list[str], out: list[np.ndarray], ssd_dir: Path) -> float:
    """GB/s of cold reads of `keys` (on SSD) through the store over one transport."""
    with KVClient(meta_address, ClientConfig(transports=(transport,), timeout_s=120)) as reader:
        _drop_cache(ssd_dir)
        started = time.perf_counter()
        for start in range(0, len(keys), len(out)):
            batch = keys[start : start + len(out)]
            reader.get_many_into(batch, out[: len(batch)])
        return sum(o.nbytes for o in out) * len(keys) / len(out) / (time.perf_counter() - started) / 1e9


def _raw_file_read(ssd_dir: Path, total: int, buf: np.ndarray) -> float:
    """GB/s of plain sequential preads over the first `total` bytes of the segment files, cold:
    the same bytes on the same file as the tier reads, without the store."""
    _drop_cache(ssd_dir)
    started, done = time.perf_counter(), 0
    for path in sorted(ssd_dir.glob("ssd-*.data")):
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for offset in range(0, size, len(buf)):
                if done >= total:
                    break
                done += os.preadv(fd, [buf.data], offset)
        finally:
            os.close(fd)
    return done / (time.perf_counter() - started) / 1e9


def _ssd_blocks(client: KVClient) -> int:
    return next((t.blocks for t in client.stats().tiers if t.tier.value == "ssd"), 0)


def _put_and_demote(client: KVClient, keys: list[str], data: np.ndarray) -> float:
    """Seconds from the first put until every one of `keys` is on SSD."""
    target = _ssd_blocks(client) + len(keys)
    started = time.perf_counter()
    for key in keys:
        client.put(key, data)
    deadline = time.monotonic() + 300
    while _ssd_blocks(client) < target and time.monotonic() < deadline:
        time.sleep(0.01)
    return time.perf_counter() - started


def measure_tiers(
    directory: str | None, total: int, block: int, transports: tuple[str, ...], progress: Callable[[str], None] = print
) -> TierResult:
    """Demote `total` bytes in blocks of `block` to SSD in `directory`, then read them back cold."""
    with tempfile.TemporaryDirectory(dir=directory, prefix="kvstore-bench-tiers-") as tmp:
        ssd_dir = Path(tmp) / "ssd"
        progress(f"raw disk ceiling in {tmp} ({total >> 20} MiB)")
        disk = raw_disk_ceiling(tmp, total)
        n = max(1, total // block)
        dram = max(2 * total, 256 << 20)
        daemon_args = ("--ssd-dir", str(ssd_dir), "--ssd", str(2 * total + (64 << 20)))
        with LocalStore(dram, dram, daemon_args, env=_DEMOTE_ALL) as store:
            data = np.random.default_rng(0).integers(0, 256, block, dtype=np.uint8)
            keys = [f"bench-tiers/{i}" for i in range(n)]
            with KVClient(store.meta_address, ClientConfig(timeout_s=120)) as client:
                progress(f"warm-up: {n} x {block >> 20} MiB through DRAM to SSD")
                _put_and_demote(client, [f"warm/{i}" for i in range(n)], data)
                client.remove_many([f"warm/{i}" for i in range(n)], force=True)
                progress(f"demoting {n} x {block >> 20} MiB to SSD")
                demote = n * block / _put_and_demote(client, keys, data) / 1e9
                reads: dict[str, float] = {}
                out = [np.empty(block, np.uint8) for _ in range(min(n, 8))]
                # This disk reads a file faster the second time it is read cold (a cache below the
                # guest): take the best of two passes of each, interleaved, so order favours none.
                for _ in range(2):
                    progress("cold raw read of the SSD segment files")
                    _best(reads, "raw file", _raw_file_read(ssd_dir, n * block, out[0]))
                    for transport in transports:
                        progress(f"cold SSD reads via {transport}")
                        _best(reads, transport, _tier_read(store.meta_address, transport, keys, out, ssd_dir))
        return TierResult(disk, block, n, demote, reads)


def report(result: TierResult) -> str:
    d = result.disk
    lines = [
        "== SSD tier (demotion and cold reads, against the raw disk in this run) ==",
        f"raw disk, {d.size >> 20} MiB: write O_DIRECT {_fmt(d.direct_write_gbps)} / buffered "
        f"{_fmt(d.buffered_write_gbps)} GB/s; cold read O_DIRECT {_fmt(d.direct_read_gbps)} / buffered "
        f"{_fmt(d.buffered_read_gbps)} GB/s",
        f"{result.blocks} blocks of {result.block >> 20} MiB",
        f"{'what':<22} {'GB/s':>6}  {'against':<32} {'ratio':>5}  (judged in == targets ==)",
    ]
    for what, gbps, against, ratio in result.comparisons():
        lines.append(f"{what:<22} {gbps:>6.2f}  {against:<32} {ratio:>5.2f}")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    print(report(measure_tiers(None, 512 << 20, 16 << 20, ("shm", "tcp"), lambda m: print("bench:", m))))
