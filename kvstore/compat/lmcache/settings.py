"""Where the LMCache plug-in connects, from LMCache's own configuration (nothing of LMCache is
imported here, so this is testable on its own).

In order: `extra_config["kvstore.meta"]`, a `kvstore://HOST:PORT` remote URL, then
$KVSTORE_LMCACHE_META. The client's settings are the usual ClientConfig (KVSTORE_CLIENT_*).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvstore.config import load_config
from kvstore.errors import InvalidArgument

SCHEME = "kvstore://"
KEY_PREFIX = "lmcache/"


@dataclass(frozen=True)
class LMCacheSettings:
    SECTION = "lmcache"

    meta: str = ""  # $KVSTORE_LMCACHE_META
    key_prefix: str = KEY_PREFIX  # $KVSTORE_LMCACHE_KEY_PREFIX


def meta_address(extra_config: Mapping[str, Any] | None, url: str | None) -> str:
    """The metadata service's address; InvalidArgument, naming the settings, if none is given."""
    if extra_config and extra_config.get("kvstore.meta"):
        return str(extra_config["kvstore.meta"])
    if url and url.startswith(SCHEME) and url[len(SCHEME) :].strip("/"):
        return url[len(SCHEME) :].strip("/")
    meta = load_config(LMCacheSettings).meta
    if meta:
        return meta
    raise InvalidArgument(
        "kvstore's LMCache plug-in needs the metadata service's address: set "
        "extra_config['kvstore.meta'], remote_url kvstore://HOST:PORT, or "
        "$KVSTORE_LMCACHE_META"
    )


def key_prefix(extra_config: Mapping[str, Any] | None) -> str:
    """What goes before LMCache's key; "" reads and writes the keys LMCache's own Mooncake Store
    connector uses (through kvstore.compat.mooncake), so the two share chunks."""
    if extra_config and extra_config.get("kvstore.key_prefix") is not None:
        return str(extra_config["kvstore.key_prefix"])
    return load_config(LMCacheSettings).key_prefix
