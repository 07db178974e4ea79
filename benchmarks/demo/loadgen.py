"""Send a workload to an OpenAI-style completions endpoint (the router, or one engine instance) at
its arrival times, streaming, and keep what each request reports.

A chat follow-up is sent once the turn it follows has been answered (and not before its own
arrival time), with that turn's prompt and answer before its own tokens: the conversation's
history, which the instances should find in kvstore.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.demo.workload import WorkItem
from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.serving import iter_sse, sse_lines


@dataclass
class Outcome:
    index: int
    kind: str
    ok: bool  # every token it asked for arrived, no error
    sent_s: float  # from the start of the run
    prompt_tokens: int  # history included
    follows: int | None = None  # the turn it follows (a chat follow-up)
    output: list[int] = field(default_factory=list)
    record: RequestMetrics | None = None  # what the router (or instance) measured
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.record.ttft_s if self.record else None

    @property
    def tpot_s(self) -> float | None:
        return self.record.tpot_s if self.record else None


@dataclass
class Run:
    label: str
    outcomes: list[Outcome]
    wall_s: float  # first send to last answer


async def _one(
    http: httpx.AsyncClient, url: str, index: int, item: WorkItem, prompt: list[int], start: float
) -> Outcome:
    sent = time.perf_counter()
    out = Outcome(index, item.kind, False, sent - start, len(prompt), item.follows)
    record: dict[str, Any] = {}
    try:
        async with http.stream(
            "POST", f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": item.max_tokens, "stream": True}
        ) as resp:
            if resp.status_code != 200:
                await resp.aread()
                out.error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return out
            async for event in iter_sse(sse_lines(resp.aiter_text())):
                if "error" in event:
                    out.error = str(event["error"])
                    return out
                out.output += event["choices"][0]["token_ids"]
                record = event.get("kvstore", record)
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.record = RequestMetrics.from_dict(record) if record else None
    out.ok = len(out.output) == item.max_tokens and out.record is not None
    if out.record is not None and out.record.ttft_s is None:
        out.ok = False
    return out


async def drive(url: str, items: list[WorkItem], label: str, timeout_s: float = 600.0) -> Run:
    """Send `items` at their arrival times (follow-ups after the turn they follow); wait for all."""
    outcomes: list[Outcome | None] = [None] * len(items)
    answered = [asyncio.Event() for _ in items]
    tty = sys.stdout.isatty()
    start = time.perf_counter()
    done = 0
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=10.0), limits=httpx.Limits(max_connections=512)
    ) as http:

        async def fire(i: int, item: WorkItem) -> None:
            nonlocal done
            await asyncio.sleep(max(0.0, item.at_s - (time.perf_counter() - start)))
            history: list[int] = []
            if item.follows is not None:
                await answered[item.follows].wait()
                history = _history(items, outcomes, item.follows) + _answered(outcomes, item.follows).output
            outcomes[i] = await _one(http, url, i, item, history + list(item.prompt), start)
            answered[i].set()
            done += 1
            line = (
                f"  {label:<18} {done:>3}/{len(items)} done, "
                f"{sum(not o.ok for o in outcomes if o)} failed, {time.perf_counter() - start:5.1f}s"
            )
            if tty:
                print("\r" + line, end="", flush=True)
            elif done % max(1, len(items) // 4) == 0 or done == len(items):
                print(line, flush=True)

        await asyncio.gather(*(fire(i, item) for i, item in enumerate(items)))
    if tty:
        print()
    return Run(label, [o for o in outcomes if o is not None], time.perf_counter() - start)


def _history(items: list[WorkItem], outcomes: list[Outcome | None], index: int) -> list[int]:
    """The prompt turn `index` was sent with (its own history first)."""
    item = items[index]
    if item.follows is None:
        return list(item.prompt)
    return _history(items, outcomes, item.follows) + _answered(outcomes, item.follows).output + list(item.prompt)


def _answered(outcomes: list[Outcome | None], index: int) -> Outcome:
    found = outcomes[index]
    assert found is not None, f"turn {index} has not been answered"
    return found
