"""Synthetic serving workloads, Poisson arrivals.

Two families:

- `WorkloadConfig` / `make_workload`: long and short prompts, some sharing a "system prompt"
  (what the router's simulation and the PD scenarios were tuned on).
- `ShapedConfig` / `make_shaped`: the request shapes of the serving papers, in `SHAPES`: RAG-like
  (long input, short output), code-like (short input, long output) and chat (short both, in
  conversations of several turns), alone or in a mix (`MIXES`). A chat follow-up names the turn
  it follows: the client sends the whole history (that turn's prompt and answer) plus its own
  tokens, once that turn has been answered.

A workload is a pure function of its config and a `salt`: the same salt gives the same requests,
a different salt keeps every length, arrival time and prefix-sharing structure but changes the
token values (so a second run starts with a cold cache and is still comparable).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadConfig:
    requests: int = 24
    rate: float = 1.5  # requests/s (Poisson)
    shared_prefixes: int = 2  # "system prompts" several requests start with
    prefix_tokens: int = 768
    suffix_tokens: tuple[int, int] = (32, 384)
    long_tokens: tuple[int, int] = (1024, 2048)
    short_tokens: tuple[int, int] = (16, 128)
    mix: tuple[float, float, float] = (0.4, 0.2, 0.4)  # shared-prefix, long unique, short
    output_tokens: int = 16
    vocab: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        if self.requests <= 0 or self.rate <= 0:
            raise ValueError("requests and rate must be positive")
        if abs(sum(self.mix) - 1.0) > 1e-9:
            raise ValueError(f"mix {self.mix} must sum to 1")


@dataclass(frozen=True)
class WorkItem:
    at_s: float  # when to send it, from the start of the run
    kind: str  # shared | long | short, or a SHAPES name
    prompt: tuple[int, ...]  # a follow-up: what it adds to the history
    max_tokens: int
    follows: int | None = None  # index of the turn whose prompt + answer come first


def make_workload(cfg: WorkloadConfig, salt: int = 0) -> list[WorkItem]:
    shape = random.Random(cfg.seed)  # lengths, kinds, arrivals: salt-independent
    content = random.Random(f"{cfg.seed}/{salt}")  # token values
    prefixes = [
        tuple(content.randrange(cfg.vocab) for _ in range(cfg.prefix_tokens)) for _ in range(cfg.shared_prefixes)
    ]
    items, at = [], 0.0
    for _ in range(cfg.requests):
        at += shape.expovariate(cfg.rate)
        kind = shape.choices(["shared", "long", "short"], weights=cfg.mix)[0]
        if kind == "shared" and prefixes:
            head = prefixes[shape.randrange(len(prefixes))]
            n = shape.randint(*cfg.suffix_tokens)
        else:
            kind = "short" if kind == "short" else "long"
            head, n = (), shape.randint(*(cfg.short_tokens if kind == "short" else cfg.long_tokens))
        prompt = head + tuple(content.randrange(cfg.vocab) for _ in range(n))
        items.append(WorkItem(round(at, 4), kind, prompt, cfg.output_tokens))
    return items


@dataclass(frozen=True)
class Shape:
    name: str
    input_tokens: tuple[int, int]  # a first turn's prompt
    output_tokens: tuple[int, int]
    turns: int = 1  # at most this many turns per conversation
    follow_up_tokens: tuple[int, int] = (16, 64)
    think_s: float = 1.0  # a follow-up comes at least this long after the turn before


SHAPES = {
    s.name: s
    for s in [
        Shape("rag", (1024, 1536), (8, 16)),  # retrieved documents in, a short answer out
        Shape("code", (64, 192), (160, 256)),  # a short instruction in, a long program out
        Shape("chat", (32, 128), (16, 48), turns=3),  # short both, several turns
    ]
}

MIXES: dict[str, dict[str, float]] = {
    "rag": {"rag": 1.0},
    "code": {"code": 1.0},
    "chat": {"chat": 1.0},
    "mixed": {"rag": 0.25, "code": 0.3, "chat": 0.45},
}


@dataclass(frozen=True)
class ShapedConfig:
    mix: str = "mixed"  # a MIXES name
    requests: int = 40  # follow-up turns included
    rate: float = 2.0  # requests/s (Poisson), follow-ups included
    seed: int = 0
    vocab: int = 256

    def __post_init__(self) -> None:
        if self.mix not in MIXES:
            raise ValueError(f"unknown workload {self.mix!r}: choose from {', '.join(MIXES)}")
        if self.requests <= 0 or self.rate <= 0:
            raise ValueError("requests and rate must be positive")


def make_shaped(cfg: ShapedConfig, salt: int = 0) -> list[WorkItem]:
    """Each Poisson arrival is a new request of a kind drawn from the mix, or, for chat, the next
    turn of an open conversation whose last turn came at least `think_s` before."""
    shape_rng = random.Random(f"{cfg.seed}/{cfg.mix}")
    content = random.Random(f"{cfg.seed}/{cfg.mix}/{salt}")
    kinds, weights = zip(*MIXES[cfg.mix].items())
    items: list[WorkItem] = []
    open_turns: dict[int, int] = {}  # last turn's index -> turns so far
    at = 0.0
    for _ in range(cfg.requests):
        at += shape_rng.expovariate(cfg.rate)
        shape = SHAPES[shape_rng.choices(kinds, weights=weights)[0]]
        ready = [
            i
            for i, n in open_turns.items()
            if items[i].kind == shape.name and n < shape.turns and items[i].at_s + shape.think_s <= at
        ]
        follows = None
        if ready and shape_rng.random() < 0.5:
            follows = ready[0]
            turns = open_turns.pop(follows) + 1
            n = shape_rng.randint(*shape.follow_up_tokens)
        else:
            turns, n = 1, shape_rng.randint(*shape.input_tokens)
        max_tokens = shape_rng.randint(*shape.output_tokens)
        prompt = tuple(content.randrange(cfg.vocab) for _ in range(n))
        items.append(WorkItem(round(at, 4), shape.name, prompt, max_tokens, follows))
        if shape.turns > 1:
            open_turns[len(items) - 1] = turns
    return items
