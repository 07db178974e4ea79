"""GPU data-path figures (scripts/device_check.sh): a get into a CUDA tensor from the GPU tier and
from DRAM, against the device's own copy ceilings measured in the same run.

Ceilings: torch device-to-device copy, host-to-device copy from pinned memory (cudaMemcpyAsync)
and from pageable memory, and a host memcpy. Each timed copy ends in a synchronize, as a get does,
so both sides pay the same per-call costs; the device-to-device copy is also timed with CUDA
events (device time alone). On a host without CUDA (`device="cpu"`, the dry run) the same code
runs with CPU tensors staged through the client's staging path (`HostStaging(stage_cpu=True)`),
the GPU tier is its host-memory stand-in, and what needs CUDA is reported as skipped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import numpy as np

from kvstore.bench.procs import LocalStore
from kvstore.client import KVClient
from kvstore.client.staging import HostStaging
from kvstore.config import ClientConfig
from kvstore.wire.calls import Get

MIB = 1 << 20


@dataclass(frozen=True)
class Rate:
    """One transfer repeated: `seconds` per run (decimal GB/s derived from it). `id` names what
    was measured for the ratios, `name` says it for people."""

    id: str
    name: str
    size: int
    seconds: tuple[float, ...]

    def gbps(self, pick: Callable[[Sequence[float]], float] = statistics.median) -> float:
        return self.size / pick(self.seconds) / 1e9

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "size": self.size,
            "runs": len(self.seconds),
            "gbps_median": round(self.gbps(), 3),
            "gbps_min": round(self.gbps(max), 3),
            "gbps_max": round(self.gbps(min), 3),
            "us_median": round(statistics.median(self.seconds) * 1e6, 1),
        }


@dataclass(frozen=True)
class Skip:
    name: str
    reason: str


def runs_for(size: int) -> int:
    return 30 if size <= 4 * MIB else 8


def _timed(fn: Callable[[], object], runs: int) -> tuple[float, ...]:
    fn()  # warm-up: first-touch allocation, pinned-buffer caching, kernel selection
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return tuple(out)


def _copier(torch: Any, src: Any, dst: Any, non_blocking: bool = False) -> Callable[[], object]:
    """dst <- src, then wait for the device (as a get waits for its copies)."""
    cuda = dst.device.type == "cuda"

    def copy() -> None:
        dst.copy_(src, non_blocking=non_blocking)
        if cuda:
            torch.cuda.synchronize(dst.device)

    return copy


def ceilings(torch: Any, device: Any, sizes: Sequence[int]) -> list[Rate | Skip]:
    out: list[Rate | Skip] = []
    cuda = device.type == "cuda"
    for size in sizes:
        n = runs_for(size)
        memcpy = _timed(partial(np.copyto, np.zeros(size, np.uint8), np.ones(size, np.uint8)), n)
        out.append(Rate("memcpy", "host memcpy (numpy)", size, memcpy))
        src = torch.ones(size, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        name = "torch device-to-device copy" if cuda else "torch cpu tensor copy (dry run)"
        out.append(Rate("d2d", name, size, _timed(_copier(torch, src, dst), n)))
        if not cuda:
            out.append(Skip("host-to-device copy (pinned, pageable)", "needs CUDA: none on this host"))
            continue
        out.append(Rate("d2d_events", f"{name}, CUDA events", size, _event_timed(torch, src, dst, n)))
        pinned = torch.ones(size, dtype=torch.uint8, pin_memory=True)
        h2d = _timed(_copier(torch, pinned, dst, non_blocking=True), n)
        out.append(Rate("h2d_pinned", "host-to-device copy from pinned memory (cudaMemcpyAsync)", size, h2d))
        h2d = _timed(_copier(torch, torch.ones(size, dtype=torch.uint8), dst), n)
        out.append(Rate("h2d_pageable", "host-to-device copy from pageable memory", size, h2d))
    return out


def _event_timed(torch: Any, src: Any, dst: Any, runs: int) -> tuple[float, ...]:
    dst.copy_(src)
    out = []
    for _ in range(runs):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        out.append(begin.elapsed_time(end) / 1e3)
    return tuple(out)


def store_gets(torch: Any, device: Any, sizes: Sequence[int], errors: list[str]) -> list[Rate | Skip]:
    """get_into a tensor on `device`, from a daemon's GPU tier (over tcp: GPU segments are not
    shared memory) and from its DRAM tier (over shm); one store each, so each key's tier is known.
    A store that fails adds to `errors`, and the other is still measured."""
    cuda = device.type == "cuda"
    gpu_env = {} if cuda else {"KVSTORE_DAEMON_GPU_DEVICE": "-1"}
    label = "" if cuda else " (dry run: host stand-in, staged cpu tensor)"
    need = 2 * sum(sizes) + 64 * MIB
    out: list[Rate | Skip] = []
    stores: tuple[tuple[str, tuple[str, ...], dict[str, str], tuple[str, ...]], ...] = (
        ("gpu tier", ("--gpu", str(need)), gpu_env, ("tcp",)),
        ("dram tier", (), {}, ("shm",)),
    )
    for tier, args, env, transports in stores:
        try:
            out += _gets_from(torch, device, sizes, tier, LocalStore(need, need, args, env=env), transports, label)
        except Exception as exc:  # noqa: BLE001 - reported with the figures that were measured
            errors.append(f"{tier}: {type(exc).__name__}: {exc}")
    return out


def _gets_from(
    torch: Any, device: Any, sizes: Sequence[int], tier: str, local: LocalStore, transports: tuple[str, ...], label: str
) -> list[Rate | Skip]:
    out: list[Rate | Skip] = []
    name = tier.split()[0]
    staging = HostStaging(ClientConfig().staging_bytes, stage_cpu=device.type != "cuda")
    with (
        local as store,
        KVClient(store.meta_address, ClientConfig(transports=transports, timeout_s=60), staging=staging) as client,
    ):
        for size in sizes:
            key = f"bench/{name}/{size}"
            value = torch.from_numpy(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8))
            client.put(key, value.to(device))
            placed = _tier_of(client, key)
            if placed != name:
                raise AssertionError(f"{key} landed on the {placed} tier, not the {tier}")
            dst = torch.empty(size, dtype=torch.uint8, device=device)
            what = f"get_into from the {tier} into a {device.type} tensor ({transports[0]}){label}"
            out.append(Rate(f"get_{name}", what, size, _timed(partial(client.get_into, key, dst), runs_for(size))))
            if not torch.equal(dst.cpu(), value):
                raise AssertionError(f"{what}: the bytes read differ from those put")
    return out


def _tier_of(client: KVClient, key: str) -> str:
    reply = client.meta.call(Get([key]))
    return reply.segments[reply.results[0].grants[0].segment_id].tier.value


def ratios(rates: Sequence[Rate | Skip]) -> list[dict[str, Any]]:
    """The issue's comparisons, per size: each get's median GB/s over a ceiling's."""
    by = {(r.id, r.size): r for r in rates if isinstance(r, Rate)}
    pairs = [
        ("get_gpu", "d2d"),
        ("get_gpu", "h2d_pinned"),
        ("get_dram", "h2d_pinned"),
        ("get_dram", "h2d_pageable"),
        ("get_dram", "memcpy"),
        ("get_gpu", "memcpy"),
    ]
    out = []
    for size in sorted({s for _, s in by}):
        for what, against in pairs:
            a, b = by.get((what, size)), by.get((against, size))
            if a is not None and b is not None:
                out.append({"size": size, "what": a.name, "against": b.name, "ratio": round(a.gbps() / b.gbps(), 4)})
    return out


def run(device_name: str, sizes: Sequence[int] = (MIB, 64 * MIB)) -> dict[str, Any]:
    """Every figure of this module, as JSON-ready data."""
    import torch

    device = torch.device(device_name)
    errors: list[str] = []
    rates = ceilings(torch, device, sizes) + store_gets(torch, device, sizes, errors)
    return {
        "rates": [r.summary() if isinstance(r, Rate) else asdict(r) for r in rates],
        "ratios": ratios(rates),
        "errors": errors,
    }
