"""Decode-side TTFT with KV from kvstore against recomputing it, on any torch device.

A prefill instance runs the prompt and saves its KV (KVBlockCodec, BLOCK objects, through the
client; from CUDA memory the client stages through pinned host memory). A decode instance, with
its own paged cache and other block ids, then serves the same prompt: looks up the cached prefix,
loads it, computes the tail (at least one token) and takes the first token. Against it: the same
decode instance recomputing the whole prompt. Both are timed from the request to the first token
on the host, with the device synchronized. The first token of both must agree; the largest logit
difference is reported (not bit-equal: the tail runs in other kernels than the whole pass).

Used by scripts/device_check.sh with a ~1B-parameter Llama shape in bf16 on the GPU, and, in its
dry run, with the tiny reference config on the CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kvstore.engines.codec import KVBlockCodec, layout_name
from kvstore.engines.keys import Granularity, KeyScheme
from kvstore.engines.reference.device_model import DeviceModel, new_planes


@dataclass(frozen=True)
class TtftResult:
    prompt_tokens: int
    store: str  # where the KV was (e.g. "dram tier over shm")
    cached_tokens: int
    kv_bytes: int
    prefill_s: float  # the prefill instance's compute
    save_s: float
    store_ttft_s: tuple[float, ...]  # per run: lookup + load + tail + first token
    load_s: tuple[float, ...]  # per run: the lookup and load within it
    recompute_ttft_s: tuple[float, ...]
    same_first_token: bool
    max_logit_diff: float

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        med_store, med_recompute = statistics.median(self.store_ttft_s), statistics.median(self.recompute_ttft_s)
        out.update(
            store_ttft_ms=_ms_stats(self.store_ttft_s),
            load_ms=_ms_stats(self.load_s),
            recompute_ttft_ms=_ms_stats(self.recompute_ttft_s),
            speedup=round(med_recompute / med_store, 3),
            load_gbps=round(self.kv_bytes / statistics.median(self.load_s) / 1e9, 3),
        )
        for k in ("store_ttft_s", "load_s", "recompute_ttft_s"):
            del out[k]
        return out


def _ms_stats(xs: Sequence[float]) -> dict[str, float]:
    return {
        "min": round(min(xs) * 1e3, 2),
        "median": round(statistics.median(xs) * 1e3, 2),
        "max": round(max(xs) * 1e3, 2),
    }


class TtftBench:
    """Prefill and decode instances of one model against one store (a KVClient)."""

    def __init__(
        self,
        model: DeviceModel,
        client: Any,
        store: str,
        block_size: int = 64,
        granularity: Granularity = Granularity.BLOCK,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.client = client
        self.store = store
        self.block_size = block_size
        self.granularity = granularity
        self.seed = seed

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    def measure(self, prompt_tokens: int, runs: int = 3) -> TtftResult:
        c, bs, device = self.model.config, self.block_size, self.model.device
        gen = torch.Generator().manual_seed(self.seed + prompt_tokens)
        prompt = torch.randint(0, c.vocab_size, (prompt_tokens,), generator=gen).tolist()
        n_blocks = -(-prompt_tokens // bs) + 1
        prefill = new_planes(c, n_blocks, bs, device)
        scheme = KeyScheme(
            model=f"{c.name}@{c.fingerprint}",
            layout=layout_name(prefill, self.granularity),
            block_size=bs,
            tenant=f"ttft-{self.store.split()[0]}",
            seed=self.seed,
        )
        hashes = scheme.block_hashes(prompt)
        usable = min(len(hashes), (prompt_tokens - 1) // bs)  # the last token is always computed
        table = list(range(n_blocks))

        self._sync()
        start = time.perf_counter()
        self.model.forward(prompt, 0, prefill, table).argmax().item()
        prefill_s = time.perf_counter() - start
        saved = KVBlockCodec(self.client, scheme, prefill, self.granularity).save(hashes[:usable], table[:usable])
        if saved.error is not None:
            raise saved.error
        del prefill

        decode = new_planes(c, n_blocks, bs, device)
        d_table = table[::-1]  # another instance's block ids
        d_codec = KVBlockCodec(self.client, scheme, decode, self.granularity)
        store_s, load_s, logits = [], [], None
        for _ in range(runs):
            self._sync()
            t0 = time.perf_counter()
            cached = d_codec.cached_blocks(hashes[:usable])
            loaded = d_codec.load(hashes[:cached], d_table[:cached])
            t1 = time.perf_counter()
            begin = loaded.blocks_loaded * bs
            logits = self.model.forward(prompt[begin:], begin, decode, d_table)
            logits.argmax().item()
            t2 = time.perf_counter()
            store_s.append(t2 - t0)
            load_s.append(t1 - t0)
        recompute_s, reference = [], None
        for _ in range(runs):
            self._sync()
            t0 = time.perf_counter()
            reference = self.model.forward(prompt, 0, decode, d_table)
            reference.argmax().item()
            recompute_s.append(time.perf_counter() - t0)
        assert logits is not None and reference is not None
        if loaded.blocks_loaded < usable:
            raise RuntimeError(
                f"{prompt_tokens} tokens: only {loaded.blocks_loaded} of {usable} blocks came back "
                f"from the store ({loaded.error!r})"
            )
        diff = (logits.float() - reference.float()).abs().max().item()
        return TtftResult(
            prompt_tokens,
            self.store,
            loaded.blocks_loaded * bs,
            loaded.nbytes,
            prefill_s,
            saved.seconds,
            tuple(store_s),
            tuple(load_s),
            tuple(recompute_s),
            int(logits.argmax()) == int(reference.argmax()),
            round(diff, 4),
        )
