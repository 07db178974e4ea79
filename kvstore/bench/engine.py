"""The engines' own KV load path (kvstore/engines/codec.py, as the reference engine and the vLLM connector
use it) against raw get_many_into of the same bytes, in the same store, in the same run.

A 2K-token prompt's KV of a model-shaped paged cache (fp16, 16-token blocks, 8 KV heads of 128)
is saved once, then loaded into another cache by the codec, per granularity: LAYER (one 64 KiB
object per block and layer, straight into the cache) and BLOCK (one object per block holding every
layer, then scattered). The raw reference reads the same number of bytes as 1 MiB objects into
one flat buffer: what the store delivers to a caller that batches large objects.

Decode-side TTFT (KV from the store vs recompute) needs the reference engine's model run in this
process; it is not measured here (the target is listed as not judged).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from kvstore.bench.results import EngineLoad, Spread
from kvstore.config import ClientConfig

PROMPT_TOKENS = 2048
BLOCK_TOKENS = 16
KV_HEADS, HEAD_DIM = 8, 128
RAW_OBJECT = 1 << 20


def _layers(quick: bool) -> int:
    return 12 if quick else 24


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def measure_codec(meta_address: str, repeats: int, quick: bool, granularity_name: str) -> EngineLoad:
    """Load the prompt's KV `repeats` times with the codec at `granularity_name` ("layer" or
    "block"), and read the same bytes raw as many times, alternating the two."""
    import torch

    from kvstore.client import KVClient
    from kvstore.engines.codec import KVBlockCodec, layout_name
    from kvstore.engines.keys import Granularity, KeyScheme

    granularity = Granularity(granularity_name)
    blocks = PROMPT_TOKENS // BLOCK_TOKENS
    shape = (blocks, 2, BLOCK_TOKENS, KV_HEADS, HEAD_DIM)
    gen = torch.Generator().manual_seed(13)
    src = [torch.randn(shape, generator=gen, dtype=torch.float32).to(torch.float16) for _ in range(_layers(quick))]
    dst = [torch.zeros_like(p) for p in src]  # a cache is touched before it is loaded into
    scheme = KeyScheme(model=f"bench-{time.monotonic_ns()}", layout=layout_name(src, granularity), block_size=16)
    hashes = scheme.block_hashes(list(range(PROMPT_TOKENS)))
    ids = list(range(blocks))
    nbytes = sum(p.numel() * p.element_size() for p in src)
    raw_keys = [f"{scheme.model}/raw/{i}" for i in range(-(-nbytes // RAW_OBJECT))]
    flat = np.zeros(len(raw_keys) * RAW_OBJECT, dtype=np.uint8)
    raw_bufs = [flat.data[i * RAW_OBJECT : (i + 1) * RAW_OBJECT] for i in range(len(raw_keys))]
    rng = np.random.default_rng(13)
    with KVClient(meta_address, ClientConfig()) as client:
        saver = KVBlockCodec(client, scheme, src, granularity)
        loader = KVBlockCodec(client, scheme, dst, granularity)
        saved = saver.save(hashes, ids)
        if saved.error is not None:
            raise saved.error
        client.put_many(raw_keys, [rng.integers(0, 256, RAW_OBJECT, dtype=np.uint8) for _ in raw_keys])
        loads, raws = [], []
        try:
            for _ in range(repeats):
                result = loader.load(hashes, ids)
                if result.error is not None or not result.complete:
                    raise RuntimeError(f"the codec loaded {result.blocks_loaded} of {blocks} blocks: {result.error}")
                loads.append(_gbps(nbytes, result.seconds))
                start = time.perf_counter()
                client.get_many_into(raw_keys, raw_bufs)
                raws.append(_gbps(len(raw_keys) * RAW_OBJECT, time.perf_counter() - start))
            if not all(torch.equal(a, b) for a, b in zip(src, dst)):
                raise RuntimeError("the codec loaded other bytes than it saved")
        finally:
            client.remove_many([*scheme.object_keys(hashes, loader.object_parts), *raw_keys], force=True)
    what = f"reference codec, {granularity.value} objects, {len(src)} layers"
    return EngineLoad(what, PROMPT_TOKENS, nbytes, Spread.of(loads), Spread.of(raws))


MEASURES: list[tuple[str, Callable[[str, int, bool], EngineLoad]]] = [
    ("codec, layer objects", lambda a, r, q: measure_codec(a, r, q, "layer")),
    ("codec, block objects", lambda a, r, q: measure_codec(a, r, q, "block")),
]
