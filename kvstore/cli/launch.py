"""Starting the servers a command runs, in this process: the metadata service and a storage
daemon, with the errors an operator can act on (a port in use, no secret)."""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING

from kvstore.config import DaemonConfig, MetaConfig, resolve_secret
from kvstore.errors import Unavailable

if TYPE_CHECKING:
    from kvstore.daemon.storage_daemon import StorageDaemon
    from kvstore.server.meta import MetaServer

__all__ = ["in_use", "start_daemon", "start_meta"]

log = logging.getLogger("kvstore")


def start_meta(cfg: MetaConfig) -> MetaServer:
    from kvstore.grant import GrantSigner
    from kvstore.server.meta import MetaServer

    secret, insecure = resolve_secret(cfg.secret)
    if insecure:
        log.warning(
            "no secret configured: grants are signed with the insecure development secret "
            "(set KVSTORE_SECRET or --secret on the service and every daemon)"
        )
    try:
        server = MetaServer(cfg, GrantSigner(secret))
    except (RuntimeError, OSError) as exc:  # gRPC says "Failed to bind to address ..."
        raise in_use(cfg.host, cfg.port, "--port") from exc
    return server.start()


def start_daemon(cfg: DaemonConfig) -> StorageDaemon:
    from kvstore.daemon.storage_daemon import StorageDaemon

    try:
        return StorageDaemon(cfg).start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise in_use(cfg.host, cfg.tcp_port, "--tcp-port") from exc
        raise


def in_use(host: str, port: int, flag: str) -> Unavailable:
    return Unavailable(f"cannot listen on {host}:{port}: the port is in use (choose another with {flag}, or 0 for any)")
