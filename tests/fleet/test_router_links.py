"""A running router's cost model follows a shaped link across namespace hosts: reference engines
(prefill, decode, and a colocated one without a store) and the router each on their own host, the
storage daemon behind a link tc throttles and restores. A long prompt half of which kvstore holds
goes PD while the link is fast (the prefill instance loads the half instead of recomputing it),
colocated once the engines have measured the throttled link (moving its KV would cost more than
the half saves), and PD again once they have measured it restored. The engines' link figures
reach the router with their answers; every wait is for a route or a figure, never a sleep."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.fleet.netns import Fleet
from tests.cluster import found
from tests.fleet import roles

BLOCK = 16  # the reference engine's block size: prefixes are whole blocks
HALF = 1024  # tokens of a prompt kvstore holds; the prompt is twice as long
THROTTLE_MBIT = 20  # a half's KV (4 MiB, the engines' default model) takes ~1.7 s over it
# Where the router's choice flips: the bandwidth at which moving a long prompt's KV costs what
# loading its stored half saves. Between the throttled link (2.5 MB/s) and the unshaped one
# (~100-200 MB/s as the engines measure it) by a factor of ~6 each way; the test sets the
# router's --kv-bytes-per-token from the prefill instance's measured speed to put it there, so
# the margins hold on a fast machine and a loaded one alike.
CROSSOVER_BYTES_PER_S = 16e6
MAX_MEASURES = 40  # decode-route loads to wait through for the engines' link figures to recover
WINDOW_S = 15  # the router forgets a link figure this old: the prefill instance's slow one, once PD stops


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def complete(url: str, tokens: list[int]) -> dict[str, Any]:
    resp = httpx.post(f"{url}/v1/completions", json={"prompt": tokens, "max_tokens": 2}, timeout=120)
    resp.raise_for_status()
    return resp.json()


class Serving:
    """The engines and the router on fleet hosts; `halves` are stored prefixes not loaded yet."""

    def __init__(self, net: Fleet, tmp: Path) -> None:
        self.fleet = roles.start(net, tmp, daemons=1, clients=0)
        self.daemon = self.fleet.daemons[0][0]
        self.urls: dict[str, str] = {}
        self._seeds = iter(range(1000, 10_000))
        kv = ["--meta", self.fleet.meta_list, "--kv-transports", "tcp", "--threads", "1", "--load-deadline", "60",
              "--kv-timeout", "60"]  # fmt: skip
        for role, store in (("prefill", kv), ("decode", kv), ("colocated", ["--threads", "1"])):
            host = net.add_host(role[:3])
            argv = [*_python(), "kvstore.engines.reference", "--role", role, "--host", host.address, "--port", "0"]
            proc = roles.spawn_on(net, host, [*argv, *store], timeout=180)
            self.urls[role] = found(r"engine=(\S+)", proc.ready_line).group(1)
        kv_bytes_per_token = self._kv_bytes_per_token()
        host = net.add_host("rt")
        argv = [*_python(), "kvstore.engines.router", "--host", host.address, "--port", "0", "--policy", "cost",
                "--prefill", self.urls["prefill"], "--decode", self.urls["decode"], "--colocated",
                self.urls["colocated"], "--meta", self.fleet.meta_list, "--kv-bytes-per-token",
                str(kv_bytes_per_token), "--bandwidth", "1e12", "--window", str(WINDOW_S)]  # fmt: skip
        self.router = found(r"router=(\S+)", roles.spawn_on(net, host, argv, timeout=120).ready_line).group(1)

    def _kv_bytes_per_token(self) -> int:
        """The cost model's KV size per token that puts the crossover at CROSSOVER_BYTES_PER_S for
        this machine's prefill speed: moving 2 * 2 * HALF tokens' KV (PD's loads and save) at the
        crossover takes as long as computing HALF tokens."""
        self.stored_half()  # the first prefill warms the engine up
        begun = time.perf_counter()
        self.stored_half()
        tokens_per_s = HALF / (time.perf_counter() - begun)
        print(f"prefill instance: {tokens_per_s:.0f} tokens/s")
        return max(1, int(CROSSOVER_BYTES_PER_S * HALF / tokens_per_s / (4 * HALF)))

    def stored_half(self) -> list[int]:
        """A new prefix of HALF tokens, saved to kvstore by the prefill instance itself (the
        router does not see it: nothing it measures reaches the router)."""
        half = prompt(HALF, next(self._seeds))
        record = complete(self.urls["prefill"], half)["kvstore"]
        assert not record["kv_save_failed"], record
        return half

    def route(self, tokens: list[int]) -> dict[str, Any]:
        record = complete(self.router, tokens)["kvstore"]
        assert record["error"] is None and record["fallback"] is None, record
        return dict(record)

    def long_route(self) -> dict[str, Any]:
        """The route of a prompt of 2 * HALF tokens whose first half kvstore holds."""
        return self.route(self.stored_half() + prompt(HALF, next(self._seeds)))

    def measure(self) -> dict[str, Any]:
        """A request the decode instance serves by loading a stored half over the daemon's link:
        its link figure reaches the router with the answer."""
        record = self.route(self.stored_half() + prompt(BLOCK, next(self._seeds)))
        assert record["route"] == "decode", record
        return record

    def routes_until(self, want: str) -> Iterator[dict[str, Any]]:
        """Long prompts' records until one takes the route `want` (MAX_MEASURES at most, a
        measuring load before each but the first)."""
        for n in range(MAX_MEASURES):
            if n:
                self.measure()
            record = self.long_route()
            yield record
            if record["route"] == want:
                return
        raise AssertionError(f"no long prompt went {want} in {MAX_MEASURES} tries")

    def bandwidth(self) -> float:
        return float(httpx.get(f"{self.router}/router/state", timeout=30).json()["bandwidth_bytes_per_s"])


def _python() -> list[str]:
    import sys

    return [sys.executable, "-m"]


def test_the_router_moves_long_prompts_off_pd_while_the_link_is_throttled_and_back(net: Fleet, tmp_path: Path):
    serving = Serving(net, tmp_path)
    fast = list(serving.routes_until("pd"))
    unshaped = serving.bandwidth()
    print(f"unshaped: {len(fast)} long prompts to the first PD; router bandwidth {unshaped / 1e6:.0f} MB/s")

    net.shape(serving.daemon, THROTTLE_MBIT)
    slow = list(serving.routes_until("colocated"))
    throttled = serving.bandwidth()
    last = slow[-1]
    print(f"{THROTTLE_MBIT} Mbit/s: {len(slow)} long prompts to the first colocated; router bandwidth "
          f"{throttled / 1e6:.1f} MB/s; {last['reason']}")  # fmt: skip
    assert throttled < unshaped / 4, (throttled, unshaped)
    assert re.search(r"colocated", last["reason"]), last

    net.restore(serving.daemon)
    back = list(serving.routes_until("pd"))
    print(f"restored: {len(back)} long prompts to the first PD; router bandwidth {serving.bandwidth() / 1e6:.0f} MB/s")
    assert serving.bandwidth() > throttled
