"""Small synthetic traces in the Mooncake format, for tests and quick runs: multi-turn sessions
whose prompts start with one of a few shared system prompts and grow turn by turn, arriving as a
Poisson process. Deterministic for a seed."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from kvstore.bench.trace.format import BLOCK_TOKENS, Request


@dataclass(frozen=True)
class SynthSpec:
    requests: int = 200
    sessions: int = 20  # conversations running at once (a finished one is replaced by a new one)
    system_prompts: int = 3  # shared prefixes, each system_blocks long
    system_blocks: int = 4
    turn_blocks: tuple[int, int] = (1, 6)  # new full blocks a turn adds (inclusive range)
    turns: tuple[int, int] = (1, 8)  # turns per conversation (inclusive range)
    rate_per_s: float = 20.0  # mean arrival rate
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.requests, self.sessions, self.system_prompts, self.system_blocks, self.turns[0]) < 1:
            raise ValueError("requests, sessions, system prompts and blocks, and turns must be at least 1")
        if self.rate_per_s <= 0 or self.turn_blocks[0] < 0 or self.turn_blocks[1] < self.turn_blocks[0]:
            raise ValueError("need a positive rate and 0 <= turn_blocks[0] <= turn_blocks[1]")


@dataclass
class _Session:
    history: list[int]  # full blocks so far (reused by the next turn)
    turns_left: int


def generate(spec: SynthSpec) -> list[Request]:
    rng = random.Random(spec.seed)
    ids = itertools.count()
    systems = [[next(ids) for _ in range(spec.system_blocks)] for _ in range(spec.system_prompts)]

    def new_session() -> _Session:
        return _Session(list(rng.choice(systems)), rng.randint(*spec.turns))

    sessions = [new_session() for _ in range(spec.sessions)]
    out: list[Request] = []
    clock_s = 0.0
    for _ in range(spec.requests):
        clock_s += rng.expovariate(spec.rate_per_s)
        slot = rng.randrange(len(sessions))
        session = sessions[slot]
        session.history += [next(ids) for _ in range(rng.randint(*spec.turn_blocks))]
        tail = rng.randint(1, BLOCK_TOKENS)  # a partial last block, unique to this request
        blocks = [*session.history, next(ids)]
        out.append(
            Request(
                int(clock_s * 1000), len(session.history) * BLOCK_TOKENS + tail, rng.randint(16, 512), tuple(blocks)
            )
        )
        session.turns_left -= 1
        if session.turns_left <= 0:
            sessions[slot] = new_session()
    return out
