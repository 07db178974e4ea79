"""The router's OpenAI-compatible front end: per request, look up the cached prefix, ask the policy
for a route, drive the instances, and record one metrics line.

A PD request is sent to the prefill instance with max_tokens=1 and `do_remote_decode`, then to
the decode instance with `expected_cached_tokens` (every full block of the prompt); the decode
instance streams the output. If the prefill instance fails, the decode instance recomputes the
prompt; if the decode (or colocated) instance fails before its first token, another instance
serves the request. Every request completes while any generating instance is up.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, AsyncIterator

import httpx

from kvstore.engines.keys import KeyScheme
from kvstore.engines.metrics import MetricsSink, RequestMetrics
from kvstore.engines.router.policy import Decision, InstanceLoad, Policy, Pools, Route, RouteRequest
from kvstore.engines.router.telemetry import Telemetry
from kvstore.engines.serving import iter_sse
from kvstore.engines.tokenizer import ByteTokenizer

log = logging.getLogger("kvstore.engines.router")


class SchemeConflict(RuntimeError):
    """Instances that share kvstore name their blocks differently: their KV would never match."""


@dataclass(frozen=True)
class BlockNaming:
    """What the router needs from the instances to ask kvstore about a prompt."""

    scheme: KeyScheme
    parts: list[int] | None
    kv_bytes_per_token: int
    storeless: frozenset[str]           # instances without a store: they recompute every prompt


async def discover(http: httpx.AsyncClient, pools: Pools) -> BlockNaming:
    """Read every instance's /kvstore/info; refuse instances whose key schemes disagree."""
    urls = list(dict.fromkeys(pools.prefill + pools.decode + pools.colocated))
    infos = {}
    for url in urls:
        resp = await http.get(f"{url}/kvstore/info")
        resp.raise_for_status()
        infos[url] = resp.json()
    with_store = {u: i for u, i in infos.items() if i["store"]} or infos
    fingerprints = {i["fingerprint"] for i in with_store.values()}
    if len(fingerprints) != 1 or any(i["tokenizer"] != "bytes" for i in infos.values()):
        raise SchemeConflict("instances disagree on the KV key scheme or tokenizer: "
                             + ", ".join(f"{u}: {i['fingerprint']} ({i['model']}, {i['layout']})"
                                         for u, i in with_store.items()))
    info = next(iter(with_store.values()))
    scheme = KeyScheme(model=info["model"], layout=info["layout"], block_size=info["block_size"],
                       tenant=info["tenant"], seed=info["hash_seed"])
    if scheme.fingerprint != info["fingerprint"]:
        raise SchemeConflict(f"this router computes fingerprint {scheme.fingerprint}, the instances "
                             f"report {info['fingerprint']}: a different kvstore version?")
    return BlockNaming(scheme, info["object_parts"], info["kv_bytes_per_token"],
                       frozenset(u for u, i in infos.items() if not i["store"]))


class Router:
    def __init__(self, pools: Pools, policy: Policy, telemetry: Telemetry, naming: BlockNaming,
                 http: httpx.AsyncClient, sink: MetricsSink, store: Any | None = None) -> None:
        self.pools = pools
        self.policy = policy
        self.telemetry = telemetry
        self.naming = naming
        self.http = http
        self.sink = sink
        self.store = store
        self.tokenizer = ByteTokenizer()
        self._load: dict[str, list[int]] = {u: [0, 0] for u in pools.prefill + pools.decode + pools.colocated}

    # -- state ---------------------------------------------------------------------------------

    def loads(self) -> dict[str, InstanceLoad]:
        return {u: InstanceLoad(r, t) for u, (r, t) in self._load.items()}

    def _track(self, url: str, requests: int, tokens: int) -> None:
        entry = self._load.setdefault(url, [0, 0])
        entry[0] += requests
        entry[1] += tokens

    def cached_tokens(self, tokens: list[int]) -> int:
        """Leading prompt tokens kvstore holds (0 without a store, or if it cannot be reached)."""
        if self.store is None:
            return 0
        hashes = self.naming.scheme.block_hashes(tokens)
        if not hashes:
            return 0
        parts = self.naming.parts
        try:
            matched = self.store.match_prefix(self.naming.scheme.object_keys(hashes, parts))
        except Exception as exc:                    # the store being down is a miss, not an error
            log.warning("match_prefix failed (%s): routing as uncached", exc)
            return 0
        return matched // (len(parts) if parts else 1) * self.naming.scheme.block_size

    # -- one request ---------------------------------------------------------------------------

    async def complete(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Serve one completion; yields OpenAI stream chunks, the last one carrying `usage` and the
        request's metrics under `kvstore`. Raises ValueError for a malformed request."""
        arrival = time.perf_counter()
        tokens = self.tokenizer.prompt_ids(body.get("prompt", ""))
        if not tokens:
            raise ValueError("empty prompt")
        max_tokens = int(body.get("max_tokens", 16))
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        cached = await asyncio.to_thread(self.cached_tokens, tokens)
        decision = self.policy.decide(RouteRequest(len(tokens), cached), self.pools, self.loads())
        log.info("request %s: %d tokens, %d cached -> %s (%s)", rid, len(tokens), cached,
                 decision.route.value, decision.reason)
        rec = RequestMetrics(rid, decision.route.value, prompt_tokens=len(tokens), reason=decision.reason)
        self.telemetry.record_arrival(decision.prefill or decision.target)
        expected = cached if decision.route is Route.DECODE else 0
        if decision.route is Route.PD:
            await self._prefill(decision, tokens, rec)
            expected = len(tokens) // self.naming.scheme.block_size * self.naming.scheme.block_size
        targets = [decision.target] + [u for u in self.pools.decode + self.pools.colocated if u != decision.target]
        first = None
        count = 0
        for i, target in enumerate(targets):
            request = {"prompt": tokens, "max_tokens": max_tokens, "stream": True,
                       "kv_transfer_params": {"expected_cached_tokens": expected}}
            reusable = expected or (0 if target in self.pools.storeless else cached)
            pending_tokens = len(tokens) - reusable
            self._track(target, 1, pending_tokens)
            try:
                async with self.http.stream("POST", f"{target}/v1/completions", json=request) as resp:
                    if resp.status_code != 200:
                        raise httpx.HTTPStatusError(f"{target} answered {resp.status_code}",
                                                    request=resp.request, response=resp)
                    async for event in iter_sse(resp.aiter_lines()):
                        if "error" in event:
                            raise RuntimeError(event["error"]["message"])
                        event["id"] = rid
                        if event["choices"][0]["token_ids"]:
                            if first is None:
                                first = time.perf_counter()
                                self._track(target, 0, -pending_tokens)
                                pending_tokens = 0
                            count += len(event["choices"][0]["token_ids"])
                        if "kvstore" in event:
                            self._fold_generation(rec, decision.route, event["kvstore"])
                            rec.output_tokens = count
                            rec.ttft_s = first - arrival if first else None
                            rec.e2e_s = time.perf_counter() - arrival
                            event["kvstore"] = asdict(rec)
                        yield event
                break
            except (httpx.HTTPError, RuntimeError) as exc:
                if first is not None or i == len(targets) - 1:
                    rec.error = f"{target}: {exc}"
                    rec.e2e_s = time.perf_counter() - arrival
                    self.sink.observe(rec)
                    raise
                log.warning("request %s: %s failed before its first token (%s); trying %s",
                            rid, target, exc, targets[i + 1])
                expected = 0                      # the next instance recomputes from scratch
            finally:
                self._track(target, -1, -pending_tokens)
        self.sink.observe(rec)

    async def _prefill(self, decision: Decision, tokens: list[int], rec: RequestMetrics) -> None:
        url = decision.prefill
        uncached = len(tokens)
        self._track(url, 1, uncached)
        try:
            resp = await self.http.post(f"{url}/v1/completions", json={
                "prompt": tokens, "max_tokens": 1, "stream": False,
                "kv_transfer_params": {"do_remote_decode": True}})
            resp.raise_for_status()
            m = resp.json()["kvstore"]
            rec.queue_s += m["queue_s"]
            rec.prefill_tokens, rec.prefill_compute_s = m["prefill_tokens"], m["prefill_compute_s"]
            rec.kv_save_s, rec.kv_save_bytes = m["kv_save_s"], m["kv_save_bytes"]
            self.telemetry.record_prefill(m["prefill_tokens"], m["prefill_compute_s"])
            if resp.json()["kv_transfer_params"].get("save_error"):
                rec.fallback = "save_failed"
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            log.warning("request %s: prefill on %s failed (%s); decode recomputes the prompt",
                        rec.request_id, url, exc)
            rec.fallback = "prefill_failed"
        finally:
            self._track(url, -1, -uncached)

    def _fold_generation(self, rec: RequestMetrics, route: Route, m: dict[str, Any]) -> None:
        """Merge the generating instance's report into the request's record."""
        rec.queue_s += m["queue_s"]
        rec.cached_tokens = m["cached_tokens"]
        rec.kv_load_s, rec.kv_load_bytes = m["kv_load_s"], m["kv_load_bytes"]
        # Loads measure the link: nothing overlaps them (saves share the CPU with compute).
        self.telemetry.record_transfer(m["kv_load_bytes"], m["kv_load_s"])
        if route is Route.COLOCATED:
            rec.prefill_tokens, rec.prefill_compute_s = m["prefill_tokens"], m["prefill_compute_s"]
            self.telemetry.record_prefill(m["prefill_tokens"], m["prefill_compute_s"])
            rec.kv_save_s, rec.kv_save_bytes = m["kv_save_s"], m["kv_save_bytes"]
        else:
            rec.recompute_tokens, rec.recompute_s = m["prefill_tokens"], m["prefill_compute_s"]
        rec.fallback = rec.fallback or m["fallback"]
        # TPOT as the generating instance timed it: a relay's clock sees tokens in bursts whenever
        # its event loop is starved, which on a shared machine says nothing about decode speed.
        rec.tpot_s = m["tpot_s"]
