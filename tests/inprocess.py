"""A whole store in the test's own process: the metadata service and one daemon serving the
`inproc` transport (and shm, for tests that reach segment files), configured from the same env
dicts the process-level tests give `kvstore meta` / `kvstore daemon`."""

from __future__ import annotations

from typing import Any

from kvstore.config import DaemonConfig, MetaConfig, resolve_secret
from kvstore.config.load import load_config
from kvstore.daemon.storage_daemon import StorageDaemon
from kvstore.grant import GrantSigner
from kvstore.server.meta import MetaServer
from tests.cluster import SECRET


class InProcessStore:
    """Started by the constructor (the daemon has mounted its segments when it returns); close()
    stops both. `daemon_settings` are DaemonConfig fields, e.g. dram_size or ssd_dir."""

    def __init__(self, meta_env: dict[str, str] | None = None, **daemon_settings: Any) -> None:
        meta_cfg = load_config(MetaConfig, env=meta_env or {}, port=0, secret=SECRET)
        self.meta = MetaServer(meta_cfg, GrantSigner(resolve_secret(meta_cfg.secret)[0])).start()
        self._env = meta_env or {}
        self.daemons: list[StorageDaemon] = []
        try:
            self.daemon = self.add_daemon(**daemon_settings)
        except BaseException:
            self.meta.stop()
            raise

    def add_daemon(self, **settings: Any) -> StorageDaemon:
        """A daemon of this service, started (its segments mounted); stopped by close() unless
        the test stopped it. Daemon settings in the meta env (heartbeats) apply to it too."""
        settings = {"transports": ("inproc", "shm"), **settings}
        cfg = load_config(DaemonConfig, env=self._env, meta_address=self.meta.address, secret=SECRET, **settings)
        daemon = StorageDaemon(cfg).start()
        self.daemons.append(daemon)
        return daemon

    @property
    def address(self) -> str:
        return self.meta.address

    def close(self) -> None:
        for daemon in reversed(self.daemons):
            if daemon.servers:  # not stopped by the test already
                daemon.stop()
        self.meta.stop()

    def __enter__(self) -> InProcessStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
