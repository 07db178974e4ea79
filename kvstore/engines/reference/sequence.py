"""One request inside the engine: what was asked, where its KV lives, how far it has got.

A sequence moves WAITING -> (LOADING ->) RUNNING -> FINISHED, and back to WAITING when it is
preempted (its blocks are taken and it is recomputed later). Its tokens are the prompt followed by
what it has generated; `num_computed` of them have their KV in the cache, under `table`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from kvstore.engines.metrics import RequestMetrics
from kvstore.jsonlog import request_id


class InvalidRequest(ValueError):
    """The request can never be served as written (bad token ids, too long)."""


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt: Seq[int]
    max_tokens: int
    expected_cached_tokens: int = 0  # prompt tokens kvstore should hold (the router's word)
    arrival: float = field(default_factory=time.perf_counter)


@dataclass
class Generation:
    tokens: list[int]
    metrics: RequestMetrics
    kv_transfer_params: dict[str, Any]


class RequestSink(Protocol):
    """Where a request's results go; called on the engine's thread."""

    def token(self, token: int) -> None:
        """One output token, as soon as it is sampled."""

    def done(self, generation: Generation) -> None:
        """The request finished (its KV saves have ended too)."""

    def failed(self, error: Exception) -> None:
        """The request cannot finish; nothing more follows."""


class Status(Enum):
    WAITING = "waiting"  # queued; no blocks
    LOADING = "loading"  # its cached prefix is arriving from kvstore into its blocks
    RUNNING = "running"  # in the batch: computing its prompt, then one token a step
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request: GenerationRequest
    sink: RequestSink
    max_tokens: int
    metrics: RequestMetrics
    tokens: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    table: list[int] = field(default_factory=list)
    num_computed: int = 0  # leading tokens whose KV is in the cache
    prompt_hashes: list[bytes] = field(default_factory=list)  # full prompt blocks (with a store)
    to_load: int = 0  # leading blocks to load from kvstore before computing
    stored_blocks: int = 0  # leading blocks kvstore holds, or a save of ours is writing
    loaded_blocks: int = 0
    listed_blocks: int = 0  # what the store listed at admission
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    load: Any = None  # PendingLoad while LOADING
    saves: list[Any] = field(default_factory=list)  # PendingSave, in order

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.request.prompt)

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def remaining(self) -> int:
        """Tokens to compute before the next one can be sampled."""
        return self.num_tokens - self.num_computed

    @property
    def decoding(self) -> bool:
        """Its next step computes only the last sampled token (a decode step, not a prefill)."""
        return self.num_generated > 0 and self.remaining == 1

    @property
    def finished(self) -> bool:
        return self.num_generated >= self.max_tokens


@dataclass(frozen=True)
class StepStats:
    sequences: int  # in the batch
    decodes: int  # of which computing one generated token
    prefill_tokens: int  # prompt (or recomputed) tokens in the batch
    seconds: float


@dataclass(frozen=True)
class EngineLoad:
    waiting: int  # submitted, not yet admitted
    running: int  # loading or in the batch
    queued_tokens: int  # prompt tokens of the waiting requests


@contextlib.contextmanager
def about(seq: Sequence) -> Iterator[None]:
    """Lines logged meanwhile, and by the transfers started meanwhile, carry the request's id (the
    router's X-Request-Id): one engine thread works for every request in the batch."""
    token = request_id.set(seq.request.request_id)
    try:
        yield
    finally:
        request_id.reset(token)


class Collect:
    """A sink that keeps the result, for `generate`."""

    def __init__(self, emit: Callable[[int], None]) -> None:
        self._emit = emit
        self.result: Generation | Exception | None = None

    def token(self, token: int) -> None:
        self._emit(token)

    def done(self, generation: Generation) -> None:
        self.result = generation

    def failed(self, error: Exception) -> None:
        self.result = error


def check_request(req: GenerationRequest, vocab_size: int, max_positions: int) -> None:
    """A request the model can take at all (the cache's room is the engine's to judge)."""
    if not req.prompt:
        raise InvalidRequest("empty prompt")
    if req.max_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1")
    if max(req.prompt) >= vocab_size or min(req.prompt) < 0:
        raise InvalidRequest(f"token ids must be in [0, {vocab_size})")
    if len(req.prompt) + req.max_tokens > max_positions:
        raise InvalidRequest(
            f"{len(req.prompt)} prompt + {req.max_tokens} new tokens is over the {max_positions}-token context"
        )
