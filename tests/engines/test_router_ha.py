"""Two router replicas fronting the same instances: killing one mid-workload fails no request that
the client retries on the other (routers keep no shared state: link estimates and load are each
replica's own)."""

from __future__ import annotations

import random
import threading
from typing import Any

import httpx
import pytest

from kvstore.engines.launch import Fleet

pytestmark = pytest.mark.slow


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def complete_on_any(routers: list[str], tokens: list[int], start: int) -> tuple[dict[str, Any], int]:
    """POST to routers[start], and on a connection failure to the next: (answer, attempts)."""
    for attempt in range(2 * len(routers)):
        url = routers[(start + attempt) % len(routers)]
        try:
            resp = httpx.post(f"{url}/v1/completions", json={"prompt": tokens, "max_tokens": 6}, timeout=120)
            resp.raise_for_status()
            return resp.json(), attempt + 1
        except (httpx.TransportError, httpx.HTTPStatusError):
            continue
    raise AssertionError(f"no router answered for a prompt of {len(tokens)} tokens")


def test_killing_one_router_fails_no_request_retried_on_the_other():
    with Fleet() as fleet:
        _, meta = fleet.store("256MiB")
        _, prefill = fleet.engine("prefill", meta)
        _, decode = fleet.engine("decode", meta)
        _, colocated = fleet.engine("colocated")
        first, r1 = fleet.router([prefill], [decode], [colocated], meta)
        _, r2 = fleet.router([prefill], [decode], [colocated], meta)
        routers = [r1, r2]
        baseline = {i: complete_on_any([r2], prompt(40 + 30 * (i % 5), i), 0)[0] for i in range(5)}
        answers: dict[int, dict[str, Any]] = {}
        retried: list[int] = []
        killed = threading.Event()

        def client(worker: int) -> None:
            for n in range(6):
                i = worker * 6 + n
                answer, attempts = complete_on_any(routers, prompt(40 + 30 * (i % 5), i % 5), i)
                answers[i] = answer
                if attempts > 1:
                    retried.append(i)
                if worker == 0 and n == 1:
                    first.kill()  # the first router dies mid-workload
                    killed.set()

        threads = [threading.Thread(target=client, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert killed.is_set() and len(answers) == 18  # every request completed
        for i, answer in answers.items():  # with the same tokens as without the kill
            assert answer["choices"][0]["token_ids"] == baseline[i % 5]["choices"][0]["token_ids"]
