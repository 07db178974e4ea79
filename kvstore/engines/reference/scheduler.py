"""Continuous batching: which sequences run in the next step, and how many tokens each computes.

Every step has a token budget (`max_batch_tokens`). Running sequences come first, oldest first:
one token each when decoding, or the next chunk of their prompt. Waiting sequences are then
admitted in arrival order into what is left of the budget, a long prompt a chunk at a time
(chunked prefill, as vLLM and SGLang do), so a step mixes decodes and prefill chunks. A sequence
whose cached prefix is in kvstore is admitted into LOADING first: it gets its blocks, the engine
loads them, and it runs once they arrive.

When a running sequence needs a block and none is free, the newest running sequence is
preempted: its blocks are freed and it waits again, at the front, to be recomputed (its prompt
and what it generated, as one prefill: the model gives the same bits that way).

Policy only: the engine runs the batch, samples, and tells the scheduler what happened.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from kvstore.engines.reference.sequence import Sequence, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences loading or running at once
    max_batch_tokens: int = 512  # tokens computed per step, all sequences together
    chunked_prefill: bool = True  # else a prompt is computed whole, in a step of its own budget

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_batch_tokens < 1:
            raise ValueError("max_num_seqs and max_batch_tokens must be at least 1")


class BlockPool(Protocol):
    """The allocator the scheduler draws on (PagedKVCache)."""

    @property
    def num_free(self) -> int: ...

    def allocate(self, n: int) -> list[int]: ...

    def free(self, ids: Seq[int]) -> None: ...


@dataclass(frozen=True)
class Scheduled:
    seq: Sequence
    num_tokens: int  # positions [seq.num_computed, + num_tokens) this step


@dataclass
class Batch:
    chunks: list[Scheduled] = field(default_factory=list)
    loads: list[Sequence] = field(default_factory=list)  # admitted into LOADING this step
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def prefill_tokens(self) -> int:
        return sum(s.num_tokens for s in self.chunks if not s.seq.decoding)

    @property
    def decodes(self) -> int:
        return sum(1 for s in self.chunks if s.seq.decoding)


class Scheduler:
    def __init__(self, config: SchedulerConfig, pool: BlockPool, block_size: int) -> None:
        self.config = config
        self.pool = pool
        self.block_size = block_size
        self.waiting: deque[Sequence] = deque()
        self.loading: list[Sequence] = []
        self.running: list[Sequence] = []  # admission order: oldest first

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.loading or self.running)

    def schedule(self) -> Batch:
        """The next step's batch. Allocates the blocks it needs; preempts if it must."""
        batch = Batch()
        budget = self.config.max_batch_tokens
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.remaining, budget)
            while not self._reserve(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                batch.chunks.append(Scheduled(seq, n))
                budget -= n
        while (
            self.waiting
            and budget > 0
            and not batch.preempted  # no room: no newcomers
            and len(self.loading) + len(self.running) < self.config.max_num_seqs
        ):
            seq = self.waiting[0]
            if seq.to_load:
                if not self._reserve(seq, seq.to_load * self.block_size - seq.num_computed):
                    break
                seq.status = Status.LOADING
                self.loading.append(self.waiting.popleft())
                batch.loads.append(seq)
                continue
            n = seq.remaining
            if self.config.chunked_prefill:
                n = min(n, budget)
            elif n > budget and batch.chunks:
                break
            if not self._reserve(seq, n):
                break
            seq.status = Status.RUNNING
            self.running.append(self.waiting.popleft())
            batch.chunks.append(Scheduled(seq, n))
            budget -= min(n, budget)
        return batch

    def loaded(self, seq: Sequence, blocks: int) -> None:
        """`seq`'s load ended with its first `blocks` blocks in place (0 if it was abandoned and its
        table freed, see `abandon_load`): it runs from there."""
        self.loading.remove(seq)
        seq.to_load = 0
        seq.num_computed = blocks * self.block_size
        seq.status = Status.RUNNING
        self.running.append(seq)

    def abandon_load(self, seq: Sequence) -> None:
        """Give up on `seq`'s load: its blocks go back (when the transfer lets go of them) and it
        computes its whole prompt."""
        self.pool.free(seq.table)
        seq.table = []
        self.loaded(seq, 0)

    def finish(self, seq: Sequence) -> None:
        """`seq` is done (or failed): out of the batch, its blocks freed."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.LOADING:
            self.loading.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.pool.free(seq.table)
        seq.table = []
        seq.status = Status.FINISHED

    def check_invariants(self) -> None:
        seqs = [*self.waiting, *self.loading, *self.running]
        assert len({id(s) for s in seqs}) == len(seqs)
        assert all(s.status is Status.WAITING and not s.table for s in self.waiting)
        assert all(s.status is Status.LOADING for s in self.loading)
        assert all(s.status is Status.RUNNING for s in self.running)
        tables = [b for s in seqs for b in s.table]
        assert len(tables) == len(set(tables)), "a block in two tables"
        assert all(len(s.table) * self.block_size >= s.num_computed for s in seqs)

    def _reserve(self, seq: Sequence, n: int) -> bool:
        """Blocks for positions up to seq.num_computed + n, if there are enough free."""
        need = -(-(seq.num_computed + n) // self.block_size) - len(seq.table)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        seq.table.extend(self.pool.allocate(need))
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.pool.free(seq.table)
        seq.table = []
        seq.num_computed = 0
        seq.to_load = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
