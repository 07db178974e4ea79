"""A small Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU; seeded weights.

It exists to check end to end that KV moved through kvstore is the KV a local prefill makes, so
it is written for determinism, not speed: fp32, attention always over the paged cache, and one
forward pass for a batch of chunks (a decode step is a chunk of one token) in which a sequence's
numbers are the same bits whatever else is in the batch and however its prompt was cut into
chunks. So continuous batching, chunked prefill, preemption and KV from another instance all
give the tokens of one request served alone. How (each part checked by tests/engines/
test_batch_invariance.py): every matrix product has a multiple of `_ROW_MULTIPLE` rows; attention
runs per prompt chunk, or for all one-token chunks together, over keys padded to whole blocks and
masked, its output summed over the keys in pieces of fixed size (`_sum_over_keys`); SiLU is built
from IEEE-exact operations (`_silu`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvstore.engines.reference.paged_cache import Chunk, PagedKVCache

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelConfig:
    name: str = "kvstore-reference-tiny"
    vocab_size: int = 512
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 688
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_positions: int = 8192
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(_DTYPES)}")

    @property
    def fingerprint(self) -> str:
        """Short digest of every field: the weights, hence the KV, are a function of these alone."""
        return hashlib.blake2b(repr(dataclasses.astuple(self)).encode(), digest_size=4).hexdigest()

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.torch_dtype.itemsize


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


_LN2_HI, _LN2_LO, _LOG2E = 0.693359375, -2.12194440e-4, 1.4426950408889634
_EXP_TAYLOR = (1 / 5040, 1 / 720, 1 / 120, 1 / 24, 1 / 6, 1 / 2, 1.0, 1.0)


def _silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) from IEEE-exact operations only (within 1e-6 of torch's silu).

    torch's own silu computes most elements with a SIMD exp and the last few of a tensor (or of
    each thread's share) with the scalar one, which rounds differently: the same row would get
    other numbers in another batch. Here exp(-|x|) is 2^n * (a degree-7 Taylor polynomial of the
    remainder), every step a +, *, /, floor or bit shift, so each element's result is a function
    of its own value alone."""
    y = x.abs().neg_().clamp_(min=-87.0)  # exp(y), y <= 0
    n = torch.floor_(y * _LOG2E + 0.5)
    r = y.sub_(n * _LN2_HI).sub_(n * _LN2_LO)  # |r| <= ln2 / 2
    p = r * _EXP_TAYLOR[0] + _EXP_TAYLOR[1]
    for coefficient in _EXP_TAYLOR[2:]:
        p.mul_(r).add_(coefficient)
    z = p.mul_(((n.to(torch.int32) + 127) << 23).view(torch.float32))  # exp(-|x|)
    return torch.where(x >= 0, 1.0, z).div_(z.add_(1.0)).mul_(x)  # sigmoid(x) * x


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ReferenceModel:
    """Weights are a function of the config alone (torch.Generator seeded with config.seed)."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = c = config
        gen = torch.Generator().manual_seed(c.seed)
        dt = c.torch_dtype

        def normal(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).to(dt)

        kv_dim = c.num_kv_heads * c.head_dim
        self.embed = normal(c.vocab_size, c.hidden_size, std=1.0)
        self.layers = []
        for _ in range(c.num_layers):
            self.layers.append(
                {
                    "attn_norm": torch.ones(c.hidden_size, dtype=dt),
                    "wq": normal(c.hidden_size, c.hidden_size, std=c.hidden_size**-0.5),
                    "wk": normal(c.hidden_size, kv_dim, std=c.hidden_size**-0.5),
                    "wv": normal(c.hidden_size, kv_dim, std=c.hidden_size**-0.5),
                    "wo": normal(c.hidden_size, c.hidden_size, std=c.hidden_size**-0.5),
                    "mlp_norm": torch.ones(c.hidden_size, dtype=dt),
                    "w_gate": normal(c.hidden_size, c.intermediate_size, std=c.hidden_size**-0.5),
                    "w_up": normal(c.hidden_size, c.intermediate_size, std=c.hidden_size**-0.5),
                    "w_down": normal(c.intermediate_size, c.hidden_size, std=c.intermediate_size**-0.5),
                }
            )
        self.final_norm = torch.ones(c.hidden_size, dtype=dt)
        self.lm_head = normal(c.hidden_size, c.vocab_size, std=c.hidden_size**-0.5)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        angles = torch.outer(torch.arange(c.max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self._cos, self._sin = angles.cos().to(dt), angles.sin().to(dt)

    def forward(
        self,
        tokens: Sequence[int],
        start: int,
        cache: PagedKVCache,
        table: Sequence[int],
        on_layer: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """One chunk alone (`forward_batch` of one): the logits of its last position."""
        return self.forward_batch([Chunk(tokens, start, table)], cache, on_layer)[0]

    @torch.inference_mode()
    def forward_batch(
        self, chunks: Sequence[Chunk], cache: PagedKVCache, on_layer: Callable[[int], None] | None = None
    ) -> torch.Tensor:
        """Run every chunk of one batch: chunk i covers positions [start, start+len(tokens)) of a
        sequence whose earlier KV is already in `cache` under block `table`; writes the chunks' KV
        there. `on_layer(l)` is called once layer l's KV for every chunk is in the cache (a save of
        that layer may begin). Returns the logits of each chunk's last position, `[len(chunks),
        vocab]`. A chunk's logits and KV do not depend on the other chunks (module docstring)."""
        c = self.config
        if not chunks:
            raise ValueError("an empty batch")
        for ch in chunks:
            if not ch.tokens:
                raise ValueError("an empty chunk")
            if ch.end > c.max_positions:
                raise ValueError(f"sequence of {ch.end} tokens is over max_positions {c.max_positions}")
        lengths = [len(ch.tokens) for ch in chunks]
        positions = torch.cat([torch.arange(ch.start, ch.end) for ch in chunks])
        x = self.embed[torch.as_tensor([t for ch in chunks for t in ch.tokens], dtype=torch.long)]
        cos, sin = self._cos[positions, None, :], self._sin[positions, None, :]
        slots = cache.slots(chunks)
        groups = _attention_groups(chunks)
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w["attn_norm"], c.rms_eps)
            q = _mm(h, w["wq"]).view(-1, c.num_heads, c.head_dim)
            k = _mm(h, w["wk"]).view(-1, c.num_kv_heads, c.head_dim)
            v = _mm(h, w["wv"]).view(-1, c.num_kv_heads, c.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            cache.write_slots(i, slots, k, v)
            if on_layer is not None:
                on_layer(i)
            attn = torch.empty(q.shape[0], c.hidden_size, dtype=q.dtype)
            for rows, members in groups:
                attn[rows] = self._attend(q[rows], [chunks[j] for j in members], cache, i)
            x = x + _mm(attn, w["wo"])
            h = _rms_norm(x, w["mlp_norm"], c.rms_eps)
            x = x + _mm(_silu(_mm(h, w["w_gate"])) * _mm(h, w["w_up"]), w["w_down"])
        last = torch.as_tensor(lengths, dtype=torch.long).cumsum(0) - 1
        return _mm(_rms_norm(x[last], self.final_norm, c.rms_eps), self.lm_head)

    def _attend(self, q: torch.Tensor, chunks: Sequence[Chunk], cache: PagedKVCache, layer: int) -> torch.Tensor:
        """Causal attention of `q` (the chunks' query rows, in order) over the paged cache: one
        chunk of any length, or several one-token chunks together; keys are padded to whole blocks
        (of the longest sequence) and masked."""
        c = self.config
        b, m = len(chunks), len(chunks[0].tokens)
        group = c.num_heads // c.num_kv_heads
        keys, values = cache.gather(layer, [ch.table for ch in chunks], max(ch.end for ch in chunks))
        length = keys.shape[2]  # [b, kv_heads, length, dim]
        query_pos = torch.stack([torch.arange(ch.start, ch.end) for ch in chunks])  # [b, m]
        masked = torch.arange(length)[None, None, :] > query_pos[:, :, None]  # [b, m, length]
        qg = q.view(b, m, c.num_kv_heads, group, c.head_dim).permute(0, 2, 3, 1, 4)
        qg = qg.reshape(b, c.num_kv_heads, group * m, c.head_dim)
        scores = _bmm(qg, keys.transpose(-1, -2)) / math.sqrt(c.head_dim)  # [b, kvh, g*m, length]
        scores = scores.view(b, c.num_kv_heads, group, m, length).masked_fill(masked[:, None, None], float("-inf"))
        probs = scores.softmax(dim=-1).view(b, c.num_kv_heads, group * m, length)
        out = _sum_over_keys(probs, values)  # [b, kvh, g*m, dim]
        return out.view(b, c.num_kv_heads, group, m, c.head_dim).permute(0, 3, 1, 2, 4).reshape(b * m, c.hidden_size)


# Products whose rows are not a multiple of this take other kernels for some rows, which round
# differently. Measured with MKL: one row of a row-major product goes through gemv, two rows against
# a transposed operand through another path; with two threads on an AVX-512 machine a product of
# under 12 rows is cut into 4-row pieces and the rows left over take another kernel. Padding every
# product to a multiple of this many rows keeps a row's numbers the same in any batch.
_ROW_MULTIPLE = 16


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w, x row-major, with the same kernel for any number of rows (see `_ROW_MULTIPLE`)."""
    return _bmm(x, w)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b over leading batch dims, `a` made row-major and padded with zero rows to a multiple of
    `_ROW_MULTIPLE` rows per product (then cut off)."""
    a = a.contiguous()
    rows = a.shape[-2]
    pad = -rows % _ROW_MULTIPLE
    if not pad:
        return a @ b
    return (F.pad(a, (0, 0, 0, pad)) @ b)[..., :rows, :]


# How many keys each piece of the attention's output product sums over (see `_sum_over_keys`).
_KEY_PIECE = 64


def _sum_over_keys(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """probs @ values, `[.., rows, length] @ [.., length, dim]`, summed over the keys in pieces of
    `_KEY_PIECE` (the last padded with zeros), one after another. `length` is set by the longest
    sequence attending together, and a BLAS splits a long sum differently for different lengths
    (measured: MKL on AVX-512 halves the sum past about 200 keys), so one product would make a
    row's numbers depend on its batch. With fixed pieces, a row's keys are summed the same way at
    any length: the pieces past its last key hold probabilities of exactly 0 and add nothing."""
    out = None
    for start in range(0, probs.shape[-1], _KEY_PIECE):
        p, v = probs[..., start : start + _KEY_PIECE], values[..., start : start + _KEY_PIECE, :]
        if (short := _KEY_PIECE - p.shape[-1]) > 0:
            p, v = F.pad(p, (0, short)), F.pad(v, (0, 0, 0, short))
        part = _bmm(p, v)
        out = part if out is None else out.add_(part)
    assert out is not None
    return out


def _attention_groups(chunks: Sequence[Chunk]) -> list[tuple[slice | torch.Tensor, list[int]]]:
    """Which chunks attend together, and the rows of the batch that are theirs: every prompt chunk
    alone; one-token (decode) chunks together, by length (up to twice as long as the shortest in
    their group), so that padding a batch to its longest sequence never costs more than double."""
    groups: list[tuple[slice | torch.Tensor, list[int]]] = []
    decodes: dict[int, tuple[list[int], list[int]]] = {}
    offset = 0
    for j, ch in enumerate(chunks):
        m = len(ch.tokens)
        if m == 1:
            members, rows = decodes.setdefault(max(ch.end - 1, 1).bit_length(), ([], []))
            members.append(j)
            rows.append(offset)
        else:
            groups.append((slice(offset, offset + m), [j]))
        offset += m
    for _, (members, rows) in sorted(decodes.items()):
        groups.append((torch.as_tensor(rows, dtype=torch.long), members))
    return groups
