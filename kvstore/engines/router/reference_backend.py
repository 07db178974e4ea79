"""The router's backend for kvstore's reference engine (`python -m kvstore.engines.reference`).

Instances describe their block naming at /kvstore/info, so the router computes a prompt's block
keys itself (byte tokens) and asks kvstore how much of it is cached. Prefill and decode are sent
token ids; decode is told how many tokens to expect (`expected_cached_tokens`: the blocks the
prefill instance stored). Each instance reports the request's measured phases under `kvstore`,
and what failed there (lookup, save, load, tokens recomputed for want of KV): the router's record
folds them together, so a degraded PD path reads as one, with a fallback reason.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

import httpx

from kvstore.engines.keys import KeyScheme
from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.router.backend import Discovery, Handoff, Prompt, SchemeConflict, all_instances
from kvstore.engines.router.policy import Pools, Route
from kvstore.engines.router.telemetry import Telemetry
from kvstore.engines.tokenizer import ByteTokenizer

log = logging.getLogger("kvstore.engines.router")


@dataclass(frozen=True)
class BlockNaming:
    """What the router needs from the instances to ask kvstore about a prompt."""

    scheme: KeyScheme
    parts: list[int] | None


class PrefixLookup(NamedTuple):
    tokens: int  # leading prompt tokens kvstore holds
    failed: bool | None  # kvstore did not answer (None: not asked)


class ReferenceBackend:
    name = "reference"

    def __init__(self, store: Any | None = None) -> None:
        self.store = store  # a KVClient for prefix lookups; None: no lookups
        self.tokenizer = ByteTokenizer()
        self.naming: BlockNaming | None = None

    async def discover(self, http: httpx.AsyncClient, pools: Pools) -> Discovery:
        """Read every instance's /kvstore/info; refuse instances whose key schemes disagree."""
        infos = {}
        for url in all_instances(pools):
            resp = await http.get(f"{url}/kvstore/info")
            resp.raise_for_status()
            infos[url] = resp.json()
        with_store = {u: i for u, i in infos.items() if i["store"]} or infos
        fingerprints = {i["fingerprint"] for i in with_store.values()}
        if len(fingerprints) != 1 or any(i["tokenizer"] != "bytes" for i in infos.values()):
            raise SchemeConflict(
                "instances disagree on the KV key scheme or tokenizer: "
                + ", ".join(f"{u}: {i['fingerprint']} ({i['model']}, {i['layout']})" for u, i in with_store.items())
            )
        info = next(iter(with_store.values()))
        scheme = KeyScheme(
            model=info["model"],
            layout=info["layout"],
            block_size=info["block_size"],
            tenant=info["tenant"],
            seed=info["hash_seed"],
        )
        if scheme.fingerprint != info["fingerprint"]:
            raise SchemeConflict(
                f"this router computes fingerprint {scheme.fingerprint}, the instances "
                f"report {info['fingerprint']}: a different kvstore version?"
            )
        self.naming = BlockNaming(scheme, info["object_parts"])
        storeless = frozenset(u for u, i in infos.items() if not i["store"])
        replicas = max(i.get("kv_replicas", 1) for i in with_store.values())  # older instances do not say
        return Discovery(info["kv_bytes_per_token"], storeless, replicas)

    def _named(self) -> BlockNaming:
        if self.naming is None:
            raise RuntimeError("the instances' block naming is not known: discover() them first")
        return self.naming

    # -- the prompt ----------------------------------------------------------------------------

    async def prompt(self, http: httpx.AsyncClient, body: dict[str, Any]) -> Prompt:
        tokens = self.tokenizer.prompt_ids(body.get("prompt", ""))
        if not tokens:
            raise ValueError("empty prompt")
        int(body.get("max_tokens", 16))  # a malformed value fails here, before any work
        found = await asyncio.to_thread(self.cached_tokens, tokens)
        return Prompt(tokens, len(tokens), found.tokens, found.failed)

    def cached_tokens(self, tokens: list[int]) -> PrefixLookup:
        """Leading prompt tokens kvstore holds (0 without a store, or if it cannot be reached)."""
        if self.store is None:
            return PrefixLookup(0, None)
        naming = self._named()
        scheme, parts = naming.scheme, naming.parts
        hashes = scheme.block_hashes(tokens)
        if not hashes:
            return PrefixLookup(0, None)
        try:
            matched = self.store.match_prefix(scheme.object_keys(hashes, parts))
        except Exception as exc:  # noqa: BLE001 - the store being down is a miss, not an error
            log.warning("match_prefix failed (%s): routing as uncached", exc)
            return PrefixLookup(0, True)
        return PrefixLookup(matched // (len(parts) if parts else 1) * scheme.block_size, False)

    # -- requests ------------------------------------------------------------------------------

    def prefill_body(self, body: dict[str, Any], prompt: Prompt) -> dict[str, Any]:
        return {
            "prompt": prompt.payload,
            "max_tokens": 1,
            "stream": False,
            "kv_transfer_params": {"do_remote_decode": True},
        }

    def prefilled(
        self, answer: dict[str, Any], wall_s: float, prompt: Prompt, rec: RequestMetrics, telemetry: Telemetry
    ) -> Handoff | None:
        m = answer["kvstore"]
        rec.queue_s += m["queue_s"]
        rec.batch_wait_s += m.get("batch_wait_s", 0.0)
        rec.prefill_tokens, rec.prefill_compute_s = m["prefill_tokens"], m["prefill_compute_s"]
        rec.kv_save_s, rec.kv_save_bytes = m["kv_save_s"], m["kv_save_bytes"]
        _fold_failures(rec, m)
        rec.fallback = rec.fallback or m["fallback"]  # KV the prefill instance itself lacked
        telemetry.record_prefill(m["prefill_tokens"], m["prefill_compute_s"])
        params = answer["kv_transfer_params"]
        stored = int(params["cached_tokens"])
        if params.get("save_error"):
            # Decode is promised only what is stored; what the hand-off lacks, it recomputes.
            block = self._named().scheme.block_size
            rec.fallback = "save_failed"
            rec.add_failures(missing_tokens=max(0, (prompt.tokens - 1) // block * block - stored))
            log.warning(
                "request %s: the prefill instance's save failed (%s); decode recomputes all but %d tokens",
                rec.request_id,
                params["save_error"],
                stored,
            )
        return self.promised(Prompt(prompt.payload, prompt.tokens, stored))

    def promised(self, prompt: Prompt) -> Handoff | None:
        if prompt.cached_tokens <= 0:
            return None
        return Handoff({"expected_cached_tokens": prompt.cached_tokens}, prompt.cached_tokens)

    def generate_body(self, body: dict[str, Any], prompt: Prompt, handoff: Handoff | None) -> dict[str, Any]:
        params = handoff.kv_transfer_params if handoff else {"expected_cached_tokens": 0}
        return {
            "prompt": prompt.payload,
            "max_tokens": int(body.get("max_tokens", 16)),
            "stream": True,
            "kv_transfer_params": params,
        }

    def fold(self, body: dict[str, Any], route: Route, telemetry: Telemetry) -> _Fold:
        return _Fold(route, telemetry)


class _Fold:
    """The instance's last event (before [DONE]) carries its metrics under `kvstore`: folded into
    the router's record, and sent on last."""

    def __init__(self, route: Route, telemetry: Telemetry) -> None:
        self.route = route
        self.telemetry = telemetry
        self.trailer: dict[str, Any] | None = None

    def chunk(self, event: dict[str, Any], rec: RequestMetrics) -> tuple[dict[str, Any] | None, int]:
        tokens = len(event["choices"][0]["token_ids"])
        if "kvstore" not in event:
            return event, tokens
        self.telemetry.record_links(event.pop("kvstore_links", None) or [])  # the instance's link monitor
        self._fold_generation(rec, event["kvstore"])
        self.trailer = event
        return None, tokens

    def finish(self, rec: RequestMetrics) -> dict[str, Any] | None:
        return self.trailer

    def _fold_generation(self, rec: RequestMetrics, m: dict[str, Any]) -> None:
        rec.queue_s += m["queue_s"]
        rec.batch_wait_s += m.get("batch_wait_s", 0.0)
        rec.cached_tokens = m["cached_tokens"]
        rec.kv_load_s, rec.kv_load_bytes = m["kv_load_s"], m["kv_load_bytes"]
        _fold_failures(rec, m)
        # Loads measure the link: nothing overlaps them (saves share the CPU with compute).
        self.telemetry.record_transfer(m["kv_load_bytes"], m["kv_load_s"])
        if self.route is Route.COLOCATED:
            rec.prefill_tokens, rec.prefill_compute_s = m["prefill_tokens"], m["prefill_compute_s"]
            self.telemetry.record_prefill(m["prefill_tokens"], m["prefill_compute_s"])
            rec.kv_save_s, rec.kv_save_bytes = m["kv_save_s"], m["kv_save_bytes"]
            rec.recompute_tokens, rec.recompute_s = 0, 0.0  # no decode instance took part
        else:
            rec.recompute_tokens, rec.recompute_s = m["prefill_tokens"], m["prefill_compute_s"]
        rec.fallback = rec.fallback or m["fallback"]
        for name in (
            "decode_steps",
            "decode_steps_with_prefill",
            "decode_steps_prefill_tokens",
            "preemptions",
            "itl_s",
        ):
            if name in m:  # what the batch did to this request's decode
                setattr(rec, name, m[name])
        # TPOT as the generating instance timed it: a relay's clock sees tokens in bursts whenever
        # its event loop is starved, which on a shared machine says nothing about decode speed.
        rec.tpot_s = m["tpot_s"]


def _fold_failures(rec: RequestMetrics, m: dict[str, Any]) -> None:
    """What an instance's record says failed there, into the router's record."""
    rec.add_failures(
        lookup=m.get("kv_lookup_failed"),
        save=m.get("kv_save_failed"),
        load=m.get("kv_load_failed"),
        missing_tokens=m.get("kv_missing_tokens"),
    )
