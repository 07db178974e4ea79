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
     "transports": ["shm", "tcp"]}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping

from kvstore.engines.codec import Granularity


@dataclass(frozen=True)
class ConnectorConfig:
    meta: str
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

    def __post_init__(self) -> None:
        if not self.meta:
            raise ValueError("kvstore connector: set kv_connector_extra_config.meta (or $KVSTORE_META) "
                             "to the kvstore metadata service address, e.g. 127.0.0.1:50051")
        for name in ("remote_save_wait_s", "lookup_backoff_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"kvstore connector: {name} must not be negative")
        for name in ("lookup_timeout_s", "transfer_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"kvstore connector: {name} must be positive")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None, default_model: str) -> "ConnectorConfig":
        extra = dict(extra or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"kvstore connector: unknown kv_connector_extra_config keys {unknown}; "
                             f"known: {sorted(known)}")
        extra.setdefault("meta", os.environ.get("KVSTORE_META", ""))
        extra["model_id"] = extra.get("model_id") or default_model
        if "granularity" in extra:
            extra["granularity"] = Granularity(extra["granularity"])
        if "transports" in extra:
            extra["transports"] = tuple(extra["transports"])
        for name in ("load_async", "save_async"):
            if name in extra and not isinstance(extra[name], bool):
                extra[name] = str(extra[name]).strip().lower() in ("1", "true", "yes", "on")
        return cls(**extra)
