"""Where a Mooncake-API store connects and with which client settings, from setup()'s arguments
and the environment (kvstore.config's loader, so the usual KVSTORE_CLIENT_* variables apply).

    KVSTORE_MOONCAKE_META=HOST:PORT    the kvstore metadata service to use whatever address the
                                       unchanged code passes as master_server_addr
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.compat.mooncake.setup_args import SetupArgs
from kvstore.config import ClientConfig, load_config


@dataclass(frozen=True)
class CompatSettings:
    SECTION = "mooncake"

    meta: str = ""  # overrides master_server_addr when set


def meta_address(master_server_addr: str) -> str:
    return load_config(CompatSettings).meta or master_server_addr


def client_config(args: SetupArgs) -> ClientConfig:
    """The client's settings: KVSTORE_CLIENT_* as usual; rdma_devices name the devices of the
    client's Mooncake transport (used only when a daemon offers that transport)."""
    return load_config(ClientConfig, mooncake_device=args.rdma_devices or None)
