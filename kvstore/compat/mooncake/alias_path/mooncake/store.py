"""`mooncake.store` under kvstore's alias: Mooncake Store's Python API served by kvstore
(kvstore.compat.mooncake; docs/compat-mooncake.md)."""

from kvstore.compat.mooncake import *  # noqa: F403 - the alias re-exports the whole API
from kvstore.compat.mooncake import __all__  # noqa: F401
