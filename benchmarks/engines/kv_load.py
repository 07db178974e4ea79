"""TTFT of a decode instance that loads a long prompt's KV from kvstore vs one that recomputes it
(`python -m benchmarks.engines.kv_load`).

The store runs as its own process (`kvstore serve`), so the KV crosses a real data plane; the
prefill and decode engines run in this process, one request at a time, alternating, and the
medians of `--repeat` runs are reported. TTFT here is the decode instance's: from its receiving
the request to its first token. The PD line adds the prefill instance's time for the whole path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from typing import TypeVar

from kvstore.engines.keys import Granularity

_T = TypeVar("_T")


@dataclass(frozen=True)
class BenchResult:
    granularity: str
    prompt_tokens: int
    ttft_recompute_s: float
    ttft_load_s: float
    load_s: float
    load_bytes: int
    prefill_s: float  # prefill instance: compute
    prefill_e2e_s: float  # prefill instance: compute + the save it waits for
    save_s: float  # time the save's puts took (overlapping the compute)

    @property
    def ratio(self) -> float:
        return self.ttft_load_s / self.ttft_recompute_s

    @property
    def load_share(self) -> float:
        return self.load_s / self.ttft_load_s

    @property
    def pd_ttft_s(self) -> float:
        return self.prefill_e2e_s + self.ttft_load_s

    @property
    def pd_transfer_share(self) -> float:
        exposed_save = self.prefill_e2e_s - self.prefill_s
        return (exposed_save + self.load_s) / self.pd_ttft_s


def bench(meta: str, prompt_tokens: int, repeat: int, granularity: Granularity, seed: int = 0) -> BenchResult:
    import torch

    from kvstore.client import KVClient
    from kvstore.engines.reference.engine import EngineConfig, GenerationRequest, ReferenceEngine, Role
    from kvstore.engines.reference.model import ModelConfig, ReferenceModel

    model = ReferenceModel(ModelConfig())
    blocks = prompt_tokens // 16 + 4
    with KVClient(meta) as kv:
        tenant = f"bench-{granularity.value}-{seed}"
        prefill = ReferenceEngine(
            model, EngineConfig(Role.PREFILL, cache_blocks=blocks, granularity=granularity, tenant=tenant), kv
        )
        loader = ReferenceEngine(
            model, EngineConfig(Role.DECODE, cache_blocks=blocks, granularity=granularity, tenant=tenant), kv
        )
        recomputer = ReferenceEngine(model, EngineConfig(Role.DECODE, cache_blocks=blocks))
        gen = torch.Generator().manual_seed(seed)
        samples: dict[str, list[float]] = {k: [] for k in ("rec", "load", "load_s", "pre", "pre_e2e", "save")}
        load_bytes = 0
        warm = torch.randint(0, 256, (64,), generator=gen).tolist()
        recomputer.generate(GenerationRequest("warm", warm, 1), lambda t: None)
        for i in range(repeat):
            prompt = torch.randint(0, 256, (prompt_tokens,), generator=gen).tolist()
            pre = prefill.generate(GenerationRequest(f"p{i}", prompt, 1), lambda t: None).metrics
            rec = recomputer.generate(GenerationRequest(f"r{i}", prompt, 2), lambda t: None)
            dec = loader.generate(GenerationRequest(f"d{i}", prompt, 2, prompt_tokens), lambda t: None)
            if dec.tokens != rec.tokens or dec.metrics.fallback:
                raise RuntimeError(
                    f"run {i}: loaded KV gave {dec.tokens}, recompute {rec.tokens} (fallback {dec.metrics.fallback})"
                )
            samples["rec"].append(_measured(rec.metrics.ttft_s))
            samples["load"].append(_measured(dec.metrics.ttft_s))
            samples["load_s"].append(_measured(dec.metrics.kv_load_s))
            samples["pre"].append(pre.prefill_compute_s)
            samples["pre_e2e"].append(pre.e2e_s)
            samples["save"].append(_measured(pre.kv_save_s))
            load_bytes = _measured(dec.metrics.kv_load_bytes)
        for e in (prefill, loader, recomputer):
            e.close()
    med = {k: statistics.median(v) for k, v in samples.items()}
    return BenchResult(
        granularity.value,
        prompt_tokens,
        med["rec"],
        med["load"],
        med["load_s"],
        load_bytes,
        med["pre"],
        med["pre_e2e"],
        med["save"],
    )


def _measured(value: _T | None) -> _T:
    """A figure the reference engine always measures (its records start from measured zeros)."""
    if value is None:
        raise RuntimeError("the reference engine left a figure of its record unmeasured")
    return value


def report(r: BenchResult) -> str:
    return "\n".join(
        [
            f"{r.prompt_tokens}-token prompt, {r.granularity} objects ({r.load_bytes / 2**20:.1f} MiB of KV loaded):",
            f"  decode TTFT, recompute       {r.ttft_recompute_s * 1e3:8.1f} ms",
            f"  decode TTFT, load from store {r.ttft_load_s * 1e3:8.1f} ms   (load {r.load_s * 1e3:.1f} ms = "
            f"{r.load_bytes / r.load_s / 1e9:.2f} GB/s)",
            f"  ratio load / recompute       {r.ratio:8.3f}      (target <= 0.3)",
            f"  KV load share of that TTFT   {r.load_share:8.1%}",
            f"  PD path: prefill {r.prefill_s * 1e3:.1f} ms compute + {(r.prefill_e2e_s - r.prefill_s) * 1e3:.1f} ms "
            f"waiting on the save (puts took {r.save_s * 1e3:.1f} ms, overlapped) "
            f"+ decode {r.ttft_load_s * 1e3:.1f} ms "
            f"= {r.pd_ttft_s * 1e3:.1f} ms; KV transfer (exposed save + load) {r.pd_transfer_share:.1%} of it",
        ]
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--meta", default=None, help="use this store (default: start `kvstore serve`)")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--granularity", default="layer,block", help="layer, block or both")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")


def run(args: argparse.Namespace) -> int:
    import torch

    from kvstore.engines.launch import Fleet

    if args.threads:
        torch.set_num_threads(args.threads)
    with Fleet() as fleet:
        meta = args.meta or fleet.store("512MiB")[1]
        for name in args.granularity.split(","):
            print(report(bench(meta, args.tokens, args.repeat, Granularity(name.strip()))), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engines.kv_load", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
