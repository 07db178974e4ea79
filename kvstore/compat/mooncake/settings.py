"""Where a Mooncake-API store connects, with which client settings, and how its keys live, from
setup()'s arguments and the environment (kvstore.config's loader, so the usual KVSTORE_CLIENT_*
variables apply).

    KVSTORE_MOONCAKE_META=HOST:PORT    the kvstore metadata service to use whatever address the
                                       unchanged code passes as master_server_addr
    KVSTORE_MOONCAKE_DROP_ON_CLOSE=1   Mooncake's segment lifetime: a store set up with a global
                                       segment (global_segment_size > 0) removes the keys it wrote
                                       when it closes, as Mooncake drops the objects of a segment
                                       unmounted at close. Off by default: kvstore's daemons hold the
                                       bytes, so keys outlive the store that put them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.compat.mooncake.setup_args import SetupArgs
from kvstore.config import ClientConfig, load_config


@dataclass(frozen=True)
class CompatSettings:
    SECTION = "mooncake"

    meta: str = ""  # overrides master_server_addr when set
    drop_on_close: bool = False  # Mooncake's segment lifetime (above)


def compat_settings() -> CompatSettings:
    return load_config(CompatSettings)


def meta_address(master_server_addr: str, settings: CompatSettings) -> str:
    return settings.meta or master_server_addr


def keeps_segment_keys(args: SetupArgs, settings: CompatSettings) -> bool:
    """Whether the store remembers the keys it writes, to remove them at close: only a store that
    mounts a segment in Mooncake's terms, and only when asked (a set entry per key it wrote)."""
    return settings.drop_on_close and args.global_segment_size > 0


def client_config(args: SetupArgs) -> ClientConfig:
    """The client's settings: KVSTORE_CLIENT_* as usual; rdma_devices name the devices of the
    client's Mooncake transport (used only when a daemon offers that transport)."""
    return load_config(ClientConfig, mooncake_device=args.rdma_devices or None)
