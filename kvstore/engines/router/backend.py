"""What the router asks of the engines behind it, whichever engine they are.

The request flow (`proxy.Router`) is the same for every engine: read the prompt, pick a route,
prefill with max_tokens=1 and hand the KV over through kvstore, stream from the generating
instance, retry before the first token. A `Backend` owns what differs: how instances are discovered,
how a prompt is counted, what the instances are sent, and what their answers report. Two are
registered in `kvstore/engines/router/cli.py`:

    reference   kvstore's reference engine: /kvstore/info, byte tokens, prefix lookups in kvstore,
                per-request metrics from the instances (`reference_backend.py`)
    vllm        vLLM OpenAI servers with kvstore's connector: /v1/models, /tokenize, the PD
                proxy protocol of vLLM's examples, metrics on the router's clock
                (`vllm_backend.py`)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from kvstore.engines.metrics import RequestMetrics
from kvstore.engines.router.policy import Pools, Route
from kvstore.engines.router.telemetry import Telemetry


class SchemeConflict(RuntimeError):
    """Instances that share kvstore name their blocks (or their models) differently: their KV would
    never match."""


class Rejected(ValueError):
    """An instance refused the request itself (HTTP 400/404/422): another instance would too."""


@dataclass(frozen=True)
class Discovery:
    kv_bytes_per_token: int  # for the cost model's link estimate
    storeless: frozenset[str]  # instances without a store: they recompute every prompt
    kv_replicas: int = 1  # replicas of each block the instances store


@dataclass(frozen=True)
class Prompt:
    """One request's prompt as the instances will see it."""

    payload: str | list[int]  # what the instances are sent as `prompt`
    tokens: int  # its length in the model's tokens (estimated where noted)
    cached_tokens: int = 0  # leading tokens whose KV kvstore holds (0: not looked up)
    lookup_failed: bool | None = None  # the router asked kvstore and got no answer (None: did not ask)
    instance_cached: Mapping[str, int] = field(default_factory=dict)  # per instance: in its own cache


@dataclass(frozen=True)
class Handoff:
    """What tells a generating instance that KV is waiting for it in kvstore."""

    kv_transfer_params: dict[str, Any]
    tokens: int  # prompt tokens it should load rather than compute


class StreamFold(Protocol):
    """Reads one generating instance's stream for one attempt."""

    def chunk(self, event: dict[str, Any], rec: RequestMetrics) -> tuple[dict[str, Any] | None, int]:
        """(the event to relay, or None to hold it back; the output tokens it carries). May fold
        what the instance reports into `rec`."""

    def finish(self, rec: RequestMetrics) -> dict[str, Any] | None:
        """After the stream ended: the last event to send (the router adds `kvstore` to it), or
        None. `rec` already holds the router's counts and times; this may refine them."""


class Backend(Protocol):
    name: str

    async def discover(self, http: httpx.AsyncClient, pools: Pools) -> Discovery:
        """Ask every instance what it serves, once, before the first request. Raises
        SchemeConflict if they cannot share KV."""

    async def prompt(self, http: httpx.AsyncClient, body: dict[str, Any]) -> Prompt:
        """Parse and measure a request's prompt (may ask kvstore or an instance; changes nothing).
        Raises ValueError for a malformed request."""

    def prefill_body(self, body: dict[str, Any], prompt: Prompt) -> dict[str, Any]:
        """The request to a prefill instance: compute the prompt, save its KV, one token out."""

    def prefilled(
        self, answer: dict[str, Any], wall_s: float, prompt: Prompt, rec: RequestMetrics, telemetry: Telemetry
    ) -> Handoff | None:
        """Fold a prefill instance's answer (which took `wall_s` on the router's clock) into `rec`
        and `telemetry`; the hand-off for the decode instance, None if nothing was stored.
        Raises KeyError or ValueError for a malformed answer."""

    def promised(self, prompt: Prompt) -> Handoff | None:
        """The hand-off for a prompt whose prefix kvstore already holds (the decode route)."""

    def generate_body(self, body: dict[str, Any], prompt: Prompt, handoff: Handoff | None) -> dict[str, Any]:
        """The streaming request to the generating instance."""

    def fold(self, body: dict[str, Any], route: Route, telemetry: Telemetry) -> StreamFold:
        """A reader for one attempt's stream."""


def all_instances(pools: Pools) -> Sequence[str]:
    return list(dict.fromkeys(pools.prefill + pools.decode + pools.colocated))
