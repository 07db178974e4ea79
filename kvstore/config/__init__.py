"""Configuration: frozen dataclasses validated on construction, built in one place.

`load_config(cls, toml_path, env, overrides)` (kvstore/config/load.py) layers, lowest to highest
precedence: the dataclass defaults, a TOML file (the table named cls.SECTION), environment variables, then explicit
overrides (the CLI flags a user gave; kvstore.config.flags makes one flag per field). A field's
environment variable is KVSTORE_<SECTION>_<FIELD>, except the settings several parts share,
which have one name everywhere (cls.ENV: KVSTORE_SECRET, KVSTORE_META). Values from TOML and env
are converted to the field's declared type. A new field gets its TOML key, env variable and flag
from its declaration alone; the comment on its line is its help text.
"""

from kvstore.config.client import ClientConfig
from kvstore.config.common import (
    DEFAULT_META_PORT,
    DEFAULT_UCX_TLS,
    INSECURE_DEV_SECRET,
    META_ENV,
    SECRET_ENV,
    TOKEN_ENV,
    random_secret,
    resolve_secret,
    split_sizes,
)
from kvstore.config.daemon import DaemonConfig
from kvstore.config.load import convert_value, env_name, field_types, load_config, parse_size, read_toml, section_of
from kvstore.config.meta import MetaConfig

__all__ = [
    "DEFAULT_META_PORT",
    "DEFAULT_UCX_TLS",
    "INSECURE_DEV_SECRET",
    "META_ENV",
    "SECRET_ENV",
    "TOKEN_ENV",
    "ClientConfig",
    "DaemonConfig",
    "MetaConfig",
    "convert_value",
    "env_name",
    "field_types",
    "load_config",
    "parse_size",
    "random_secret",
    "read_toml",
    "resolve_secret",
    "section_of",
    "split_sizes",
]
