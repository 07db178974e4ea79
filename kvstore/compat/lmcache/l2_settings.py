"""What the L2 adapter is given in LMCache's `--l2-adapter` JSON (its `adapter_params`), parsed
and checked without importing LMCache.

    {"type": "plugin", "module_path": "kvstore.compat.lmcache.l2_adapter",
     "class_name": "KVStoreL2Adapter",
     "adapter_params": {"meta": "HOST:PORT", "key_prefix": "lmcache/", "num_workers": 4,
                        "salt_token_env": {"team-a": "KVSTORE_TOKEN_TEAM_A"}}}

`meta` falls back to $KVSTORE_LMCACHE_META and `key_prefix` to $KVSTORE_LMCACHE_KEY_PREFIX (as
the in-process plug-in's settings do). `salt_token_env` maps a request's `cache_salt` to the
environment variable that holds a kvstore tenant token: that salt's chunks are stored as that
tenant (its namespace, its quotas). Tokens never go in the JSON itself: LMCache's command line
is visible to every user of the host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvstore.compat.lmcache import settings
from kvstore.errors import InvalidArgument

KNOWN = frozenset({"meta", "key_prefix", "num_workers", "salt_token_env"})
MAX_WORKERS = 64


@dataclass(frozen=True)
class L2Settings:
    meta: str
    key_prefix: str = settings.KEY_PREFIX
    num_workers: int = 4  # threads running store, lookup and load tasks
    salt_token_env: Mapping[str, str] = field(default_factory=dict)  # cache_salt -> env var with a token

    def __post_init__(self) -> None:
        if not self.meta:
            raise InvalidArgument("the L2 adapter needs the metadata service's address (adapter_params.meta)")
        if not 1 <= self.num_workers <= MAX_WORKERS:
            raise InvalidArgument(f"num_workers must be 1..{MAX_WORKERS}, not {self.num_workers}")
        for salt, var in self.salt_token_env.items():
            if not salt or not var:
                raise InvalidArgument("salt_token_env maps non-empty cache salts to environment variable names")

    def token_for(self, cache_salt: str) -> str | None:
        """The tenant token chunks of `cache_salt` are stored with; None: the process's own.
        InvalidArgument if the salt is mapped and its variable is unset."""
        var = self.salt_token_env.get(cache_salt)
        if var is None:
            return None
        token = os.environ.get(var, "").strip()
        if not token:
            raise InvalidArgument(f"cache_salt {cache_salt!r} is mapped to ${var}, which is not set")
        return token


def parse(params: Mapping[str, Any] | None) -> L2Settings:
    """L2Settings from LMCache's adapter_params; InvalidArgument names what is wrong."""
    params = dict(params or {})
    unknown = set(params) - KNOWN
    if unknown:
        raise InvalidArgument(f"unknown kvstore L2 adapter params {sorted(unknown)} (known: {sorted(KNOWN)})")
    workers = params.get("num_workers", 4)
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise InvalidArgument(f"num_workers must be an integer, not {workers!r}")
    salts = params.get("salt_token_env", {})
    if not isinstance(salts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in salts.items()):
        raise InvalidArgument("salt_token_env must map cache salts to environment variable names")
    meta = params.get("meta")
    prefix = params.get("key_prefix")
    return L2Settings(
        meta=settings.meta_address({"kvstore.meta": meta} if meta else None, None),
        key_prefix=settings.key_prefix({"kvstore.key_prefix": prefix} if prefix is not None else None),
        num_workers=workers,
        salt_token_env=dict(salts),
    )
