"""The router's OpenAI-compatible front end: per request, measure the prompt, ask the policy for a
route, drive the instances, and record one metrics line. What differs between engines (discovery,
prompts, what instances are sent and report) is the `Backend`'s; this is the flow.

A PD request is sent to the prefill instance with max_tokens=1 and `do_remote_decode`; its answer
becomes the hand-off (`kv_transfer_params`) of the decode request, and the decode instance streams
the output. If the prefill instance fails, the decode instance recomputes the prompt. If the
generating instance fails before its first token, it is asked again without the hand-off (it
recomputes; a `decode_failed` fallback), then every other instance in turn. Every request completes
while any generating instance is up. TTFT is timed on the router's clock, and so is TPOT unless the
instance reports its own.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

import httpx

from kvstore.engines.metrics import MetricsSink, RequestMetrics
from kvstore.engines.router.backend import Backend, Handoff, Prompt, Rejected
from kvstore.engines.router.policy import Decision, InstanceLoad, Policy, Pools, Route, RouteRequest
from kvstore.engines.router.telemetry import Telemetry
from kvstore.engines.serving import iter_sse, sse_lines
from kvstore.jsonlog import REQUEST_ID_HEADER, request_id
from kvstore.jsonlog import event as log_event

log = logging.getLogger("kvstore.engines.router")

# Upstream answers that blame the request, not the instance: retrying elsewhere cannot help.
_REJECTED = frozenset({400, 404, 422})


class Router:
    def __init__(
        self,
        pools: Pools,
        policy: Policy,
        telemetry: Telemetry,
        backend: Backend,
        http: httpx.AsyncClient,
        sink: MetricsSink,
    ) -> None:
        self.pools = pools
        self.policy = policy
        self.telemetry = telemetry
        self.backend = backend
        self.http = http
        self.sink = sink
        self._load: dict[str, list[int]] = {u: [0, 0] for u in pools.prefill + pools.decode + pools.colocated}

    # -- state ---------------------------------------------------------------------------------

    def loads(self) -> dict[str, InstanceLoad]:
        return {u: InstanceLoad(r, t) for u, (r, t) in self._load.items()}

    def _track(self, url: str, requests: int, tokens: int) -> None:
        entry = self._load.setdefault(url, [0, 0])
        entry[0] += requests
        entry[1] += tokens

    # -- one request ---------------------------------------------------------------------------

    async def complete(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Serve one completion; yields OpenAI stream chunks, the last one carrying `usage` and the
        request's metrics under `kvstore`. Raises ValueError for a malformed request."""
        arrival = time.perf_counter()
        prompt = await self.backend.prompt(self.http, body)
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        request_id.set(rid)  # this request's log lines carry it; instances get it as X-Request-Id
        headers = {REQUEST_ID_HEADER: rid}
        decision = self.policy.decide(
            RouteRequest(prompt.tokens, prompt.cached_tokens, prompt.instance_cached), self.pools, self.loads()
        )
        log.info(
            "request %s: %d tokens, %d cached -> %s (%s)",
            rid,
            prompt.tokens,
            prompt.cached_tokens,
            decision.route.value,
            decision.reason,
        )
        rec = RequestMetrics(
            rid,
            decision.route.value,
            prompt_tokens=prompt.tokens,
            reason=decision.reason,
            kv_lookup_failed=prompt.lookup_failed,
        )
        record_decision(rec, decision)
        self.telemetry.record_arrival(decision.prefill or decision.target)
        handoff = self.backend.promised(prompt) if decision.route is Route.DECODE else None
        if decision.route is Route.PD:
            handoff = await self._prefill(decision, body, prompt, rec, headers)
        attempts: list[tuple[str, Handoff | None]] = [(decision.target, handoff)]
        if handoff is not None:
            attempts.append((decision.target, None))  # the same instance recomputes
        attempts += [(u, None) for u in self.pools.decode + self.pools.colocated if u != decision.target]
        clock = _TokenClock()
        for i, (target, given) in enumerate(attempts):
            reusable = given.tokens if given else (0 if target in self.pools.storeless else prompt.cached_tokens)
            reusable = max(reusable, prompt.instance_cached.get(target, 0))  # its own cache
            pending_tokens = prompt.tokens - reusable
            self._track(target, 1, pending_tokens)
            fold = self.backend.fold(body, decision.route, self.telemetry)
            try:
                async with self.http.stream(
                    "POST",
                    f"{target}/v1/completions",
                    headers=headers,
                    json=self.backend.generate_body(body, prompt, given),
                ) as resp:
                    await _check(resp, target)
                    async for event in iter_sse(sse_lines(resp.aiter_text())):
                        if "error" in event:
                            raise RuntimeError(_message(event))
                        out, tokens = fold.chunk(event, rec)
                        if tokens and clock.first is None:
                            self._track(target, 0, -pending_tokens)
                            pending_tokens = 0
                        clock.tick(tokens)
                        if out is not None:
                            out["id"] = rid
                            yield out
                rec.output_tokens = clock.count
                rec.ttft_s = clock.first - arrival if clock.first else None
                rec.tpot_s = rec.tpot_s if rec.tpot_s is not None else clock.tpot()
                rec.e2e_s = time.perf_counter() - arrival
                if (trailer := fold.finish(rec)) is not None:
                    rec.ttft_phases = rec.split_ttft()
                    trailer["id"] = rid
                    trailer["kvstore"] = asdict(rec)
                    yield trailer
                rec.ttft_phases = rec.split_ttft()
                break
            except Rejected as exc:
                self._fail(rec, target, exc, arrival)
                raise
            except (httpx.HTTPError, RuntimeError) as exc:
                if clock.first is not None or i == len(attempts) - 1:
                    self._fail(rec, target, exc, arrival)
                    raise
                if given is not None:
                    rec.fallback = rec.fallback or "decode_failed"
                log.warning(
                    "request %s: %s failed before its first token (%s); trying %s%s",
                    rid,
                    target,
                    exc,
                    attempts[i + 1][0],
                    "" if attempts[i + 1][1] else ", recomputing",
                )
            finally:
                self._track(target, -1, -pending_tokens)
        if rec.fallback:
            log_event(log, "fallback", logging.WARNING, request_id=rid, reason=rec.fallback, route=rec.route)
        self.sink.observe(rec)

    def _fail(self, rec: RequestMetrics, target: str, exc: Exception, arrival: float) -> None:
        rec.error = f"{target}: {exc}"
        rec.e2e_s = time.perf_counter() - arrival
        self.sink.observe(rec)

    async def _prefill(
        self, decision: Decision, body: dict[str, Any], prompt: Prompt, rec: RequestMetrics, headers: dict[str, str]
    ) -> Handoff | None:
        url = decision.prefill
        assert url is not None, "a PD decision names its prefill instance"
        self._track(url, 1, prompt.tokens)
        start = time.perf_counter()
        try:
            resp = await self.http.post(
                f"{url}/v1/completions", headers=headers, json=self.backend.prefill_body(body, prompt)
            )
            resp.raise_for_status()
            return self.backend.prefilled(resp.json(), time.perf_counter() - start, prompt, rec, self.telemetry)
        except (httpx.HTTPError, KeyError, ValueError, TypeError) as exc:
            log.warning("request %s: prefill on %s failed (%s); decode recomputes the prompt", rec.request_id, url, exc)
            rec.fallback = "prefill_failed"
            return None
        finally:
            self._track(url, -1, -prompt.tokens)


def record_decision(rec: RequestMetrics, decision: Decision) -> None:
    """The rule and the cost model's estimate behind a route, in the request's record."""
    rec.route_rule = decision.rule
    if (est := decision.estimate) is not None:
        rec.est_kv_bytes, rec.est_bandwidth, rec.est_transfer_s = est.kv_bytes, est.bandwidth, est.transfer_s
        rec.est_saved_s, rec.est_queue_saved_s = est.saved_s, est.queue_saved_s
        rec.est_interference_saved_s = est.interference_saved_s


class _TokenClock:
    """Output tokens as the router sees them arrive."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0

    def tick(self, tokens: int) -> None:
        if tokens:
            self.last = time.perf_counter()
            self.first = self.first or self.last
            self.count += tokens

    def tpot(self) -> float | None:
        if self.count > 1 and self.first is not None and self.last is not None:  # both set by the first tick
            return (self.last - self.first) / (self.count - 1)
        return None


async def _check(resp: httpx.Response, target: str) -> None:
    if resp.status_code == 200:
        return
    await resp.aread()
    try:
        detail = _message(resp.json())
    except ValueError:
        detail = resp.text[:500]
    message = f"{target} answered {resp.status_code}: {detail}"
    if resp.status_code in _REJECTED:
        raise Rejected(message)
    raise httpx.HTTPStatusError(message, request=resp.request, response=resp)


def _message(answer: Any) -> str:
    """The message of an OpenAI-style error answer ({"error": {"message": ...}} or {"message": ...})."""
    if isinstance(answer, dict):
        error = answer.get("error", answer)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(answer)[:500]
