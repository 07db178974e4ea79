"""The connector's settings, read once from `kv_connector_extra_config`.

{"meta": "127.0.0.1:50051",       # kvstore metadata service (else $KVSTORE_META)
 "tenant": "default",             # key namespace: tenants never share blocks
 "model_id": "...",               # defaults to the served model name
 "hash_seed": 0,                  # every instance that shares KV must use the same seed
 "granularity": "layer",          # "layer": one object per (block, layer), saved as each layer
                                  #   finishes; "block": one object per block, all layers
 "load_async": true,              # load between scheduler steps (true) or before the forward
 "save_async": false,             # false: a step's saves commit before its output is
                                  #   returned (PD-safe); true: blocks are held until acked
 "remote_save_wait_s": 2.0,       # decode: how long to wait for blocks a prefill reported
 "lookup_timeout_s": 2.0,         # scheduler lookups; a failed one is a miss
 "lookup_backoff_s": 5.0,         # after a failed lookup, skip lookups this long
 "transfer_timeout_s": 10.0,      # worker loads / saves
 "transports": ["shm", "tcp"],
 "stage_host_caches": false,      # move a CPU cache through host staging rows as a CUDA cache is
                                  #   moved (its host stand-in: the same code path, for tests)
 "block_names": "kvstore"}        # "vllm": name blocks by vLLM's own block hashes, so the store's
                                  #   KV events carry them (llm-d resolves those; docs/kv-events.md)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, ClassVar

from kvstore.config import META_ENV, TOKEN_ENV, load_config
from kvstore.engines.keys import Granularity
from kvstore.errors import InvalidArgument


class BlockNames(str, Enum):
    """Whose hash names a block: kvstore's (kvstore.blockhash over the tokens, which kvstore's
    router and indexer compute too) or vLLM's own (`request.block_hashes`, which vLLM's KV events
    carry, so an indexer that learned them from the engines matches the store's blocks)."""

    KVSTORE = "kvstore"
    VLLM = "vllm"


@dataclass(frozen=True)
class ConnectorConfig:
    """Read by kvstore.config.load_config: kv_connector_extra_config's keys are the fields, and
    each field can also be set as $KVSTORE_VLLM_<FIELD> ($KVSTORE_META for `meta`)."""

    SECTION: ClassVar[str] = "vllm"
    ENV: ClassVar[dict[str, str]] = {"meta": META_ENV, "token": TOKEN_ENV}

    meta: str = ""
    # The store's bearer token: $KVSTORE_TOKEN (vLLM logs its kv_transfer_config, so a token
    # given there would reach vLLM's log), else the token file. Never part of repr or a log line.
    token: str = field(default="", repr=False)
    tenant: str = "default"
    model_id: str = ""
    hash_seed: int = 0
    granularity: Granularity = Granularity.LAYER
    load_async: bool = True
    save_async: bool = False
    remote_save_wait_s: float = 2.0
    lookup_timeout_s: float = 2.0
    lookup_backoff_s: float = 5.0
    transfer_timeout_s: float = 10.0
    transports: tuple[str, ...] = ("shm", "tcp")
    stage_host_caches: bool = False
    block_names: BlockNames = BlockNames.KVSTORE

    def __post_init__(self) -> None:
        if not self.meta:
            raise InvalidArgument(
                "set kv_connector_extra_config.meta (or $KVSTORE_META) "
                "to the kvstore metadata service address, e.g. 127.0.0.1:50051"
            )
        for name in ("remote_save_wait_s", "lookup_backoff_s"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must not be negative")
        for name in ("lookup_timeout_s", "transfer_timeout_s"):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None, default_model: str) -> ConnectorConfig:
        """The settings in `extra` (kv_connector_extra_config) over env over the defaults; the
        model id defaults to the served model's name."""
        extra = dict(extra or {})
        try:
            config = load_config(cls, None, None, **extra)
        except InvalidArgument as exc:
            raise InvalidArgument(f"kvstore connector: {exc}") from None
        return config if config.model_id else replace(config, model_id=default_model)
