"""Synthetic serving workloads: long and short prompts, shared prefixes, Poisson arrivals.

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
    rate: float = 1.5                       # requests/s (Poisson)
    shared_prefixes: int = 2                # "system prompts" several requests start with
    prefix_tokens: int = 768
    suffix_tokens: tuple[int, int] = (32, 384)
    long_tokens: tuple[int, int] = (1024, 2048)
    short_tokens: tuple[int, int] = (16, 128)
    mix: tuple[float, float, float] = (0.4, 0.2, 0.4)   # shared-prefix, long unique, short
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
    at_s: float                             # when to send it, from the start of the run
    kind: str                               # shared | long | short
    prompt: tuple[int, ...]
    max_tokens: int


def make_workload(cfg: WorkloadConfig, salt: int = 0) -> list[WorkItem]:
    shape = random.Random(cfg.seed)                     # lengths, kinds, arrivals: salt-independent
    content = random.Random(f"{cfg.seed}/{salt}")       # token values
    prefixes = [tuple(content.randrange(cfg.vocab) for _ in range(cfg.prefix_tokens))
                for _ in range(cfg.shared_prefixes)]
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
