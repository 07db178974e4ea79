"""`kvstore serve`, `meta`, `daemon` and `clean`: the servers, and what they leave behind.

Every setting is a flag made from its config field (kvstore.config.flags), so flags given beat
env, env beats the --config file, and the file beats the defaults.

Each server says where it listens in one ready line, its observability ports appended when on:
`kvstore ready: meta=ADDR [admin=ADDR] [metrics=ADDR]` (serve, meta) and
`kvstore ready: daemon=ID ENDPOINTS [metrics=ADDR]` (daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kvstore.cli.launch import start_daemon, start_meta
from kvstore.cli.shardprocs import ShardProcesses, shard_config
from kvstore.cli.stopping import StopSignals
from kvstore.config import DaemonConfig, MetaConfig, random_secret
from kvstore.config.flags import ConfigFlags
from kvstore.errors import InvalidArgument, KeyBusy
from kvstore.logs import say_ready
from kvstore.meta.shardmap import StaticShards

if TYPE_CHECKING:
    from kvstore.daemon.storage_daemon import StorageDaemon
    from kvstore.server.meta import MetaServer

log = logging.getLogger("kvstore")
# Short flags for the settings people type most; every other field's flag is its name.
DAEMON_ALIASES = {"dram_size": "dram", "ssd_size": "ssd", "gpu_size": "gpu", "meta_address": "meta"}
META_ALIASES = {"redis_url": "redis"}


def add_command(name: str, sp: argparse.ArgumentParser) -> None:
    if name == "clean":
        sp.add_argument("--ssd-dir", help="an SSD tier's directory: delete its segment files and journals")
        sp.add_argument("--shm-dir", default="/dev/shm", help="where DRAM segment files live (default: /dev/shm)")
        sp.set_defaults(run=cmd_clean)
        return
    sp.add_argument("--config", metavar="FILE", help="TOML file with [meta] / [daemon] tables")
    flags = ConfigFlags()
    if name in ("serve", "meta"):
        flags.add(sp, MetaConfig, META_ALIASES)
    if name in ("serve", "daemon"):
        skip = {"meta_address"} if name == "serve" else set()
        flags.add(sp, DaemonConfig, DAEMON_ALIASES, skip=skip, share={"host", "secret"})
    if name == "serve":
        sp.add_argument(
            "--shards",
            type=int,
            default=1,
            metavar="S",
            help="metadata shards, each its own process (default 1; docs/sharding.md)",
        )
    sp.set_defaults(run={"serve": cmd_serve, "meta": cmd_meta, "daemon": cmd_daemon}[name], flags=flags)


def _say_token(meta: MetaServer) -> None:
    if not meta.config.auth:
        print("kvstore: authentication is OFF (auth = false): anyone who reaches the port is the admin", flush=True)
    elif meta.token_source:
        print(
            f"kvstore admin token in {meta.token_source} (kvstore commands and clients run by you pick it up; "
            "`kvstore tenant token NAME` makes tokens for others)",
            flush=True,
        )


def _endpoints(daemon: StorageDaemon) -> str:
    return ", ".join(f"{name} {addr.split('|')[-1]}" for name, addr in sorted(daemon.endpoints().items()))


def _observed(meta: MetaServer | None, daemon: StorageDaemon | None) -> str:
    """' admin=ADDR' (the service's HTTP admin face) and ' metrics=ADDR' (the daemon's /metrics),
    for those that are on."""
    admin = f" admin={meta.admin.address}" if meta is not None and meta.admin is not None else ""
    metrics = f" metrics={daemon.metrics_address}" if daemon is not None and daemon.metrics_address else ""
    return admin + metrics


def reservation(cfg: DaemonConfig) -> str:
    """What a daemon with `cfg` takes from this machine, in words, and what it leaves at stop."""
    parts = [f"{cfg.dram_size >> 20} MiB of memory (DRAM tier: files in {cfg.shm_dir}, removed at stop)"]
    if cfg.ssd_dir:
        parts.append(
            f"{cfg.ssd_size >> 20} MiB of disk preallocated in {cfg.ssd_dir} (SSD tier: kept at stop so a "
            f"restart finds its blocks; `kvstore clean --ssd-dir {cfg.ssd_dir}` deletes it)"
        )
    else:
        parts.append("no disk (no SSD tier: add one with --ssd-dir DIR --ssd SIZE)")
    if cfg.gpu_size:
        parts.append(f"{cfg.gpu_size >> 20} MiB of GPU memory on cuda:{cfg.gpu_device}")
    return "; ".join(parts)


def cmd_serve(args: argparse.Namespace) -> int:
    stopping = StopSignals()
    flags: ConfigFlags = args.flags
    meta_cfg = flags.load(MetaConfig, args)
    if not meta_cfg.secret:  # the embedded store's two parts share a fresh key
        meta_cfg = flags.load(MetaConfig, args, secret=random_secret())
    daemon_cfg = flags.load(DaemonConfig, args, secret=meta_cfg.secret, meta_address="0.0.0.0:0")
    print(f"kvstore serve reserves {reservation(daemon_cfg)}", flush=True)
    shards = _start_shards(meta_cfg, args.shards)
    try:
        meta = start_meta(meta_cfg if shards is None else shard_config(meta_cfg, 0, args.shards))
    except BaseException:
        if shards is not None:
            shards.stop()
        raise
    try:
        if shards is not None:
            addresses = [meta.address, *shards.addresses]
            if isinstance(meta.shards, StaticShards):  # on Redis each shard's leader record says it
                meta.shards.update(addresses)
            shards.share_map(addresses)
            print(f"kvstore meta shards 1..{args.shards - 1} at {', '.join(shards.addresses)}", flush=True)
        tls = _daemon_tls(meta_cfg, daemon_cfg)
        daemon = start_daemon(flags.load(DaemonConfig, args, secret=meta_cfg.secret, meta_address=meta.address, **tls))
    except BaseException:
        meta.stop()
        if shards is not None:
            shards.stop()
        raise
    print(f"kvstore meta listening on {meta.address}", flush=True)
    print(f"kvstore daemon {daemon.daemon_id} via {_endpoints(daemon)}", flush=True)
    _say_token(meta)
    say_ready(f"meta={meta.address}{_observed(meta, daemon)} (Ctrl-C to stop)")
    stopping.wait()
    daemon.stop()
    meta.stop()
    if shards is not None:
        shards.stop()
    print("kvstore stopped", flush=True)
    return 0


def _start_shards(cfg: MetaConfig, count: int) -> ShardProcesses | None:
    """Shards 1..count-1 in processes of their own (None: one shard, the serving process)."""
    if count == 1:
        return None
    if not 1 <= count <= 64:
        raise InvalidArgument(f"--shards {count}: give 1 to 64 shards")
    if cfg.shard:
        raise InvalidArgument("give --shards (serve every shard here) or --shard I/S (be one of them), not both")
    return ShardProcesses(cfg, count)


def _daemon_tls(meta: MetaConfig, daemon: DaemonConfig) -> dict[str, str]:
    """The embedded daemon reaches a TLS service by pinning its certificate, and shows the
    service's own certificate when the service asks for one (mutual TLS), unless told otherwise."""
    if not meta.tls_cert or daemon.tls_ca:
        return {}
    own = {} if daemon.tls_cert or not meta.tls_ca else {"tls_cert": meta.tls_cert, "tls_key": meta.tls_key}
    return {"tls_ca": meta.tls_cert, **own}


def cmd_meta(args: argparse.Namespace) -> int:
    stopping = StopSignals()
    meta = start_meta(args.flags.load(MetaConfig, args))
    _say_token(meta)
    say_ready(f"meta={meta.address}{_observed(meta, None)}")
    stopping.wait()
    meta.stop()
    return 0


def cmd_daemon(args: argparse.Namespace) -> int:
    stopping = StopSignals()
    cfg = args.flags.load(DaemonConfig, args)
    print(f"kvstore daemon reserves {reservation(cfg)}", flush=True)
    daemon = start_daemon(cfg)
    say_ready(f"daemon={daemon.daemon_id} {_endpoints(daemon)}{_observed(None, daemon)}")
    stopping.wait()
    daemon.stop()
    return 0


SSD_FILES = ("ssd-*.data", "ssd-*.id", "ssd-*.journal")


def cmd_clean(args: argparse.Namespace) -> int:
    """Delete segment files of daemons that were killed (their pid is gone) and, with --ssd-dir,
    an SSD tier's files (stop its daemon first: its blocks are gone for good)."""
    from kvstore.daemon.storage_daemon import sweep_stale_segments

    swept = sweep_stale_segments(args.shm_dir)
    print(f"removed {swept} segment files of stopped daemons from {args.shm_dir}")
    if args.ssd_dir:
        directory = Path(args.ssd_dir)
        if not directory.is_dir():
            raise FileNotFoundError(2, "no such directory", str(directory))
        with _ssd_lock(directory):
            files = sorted({p for pattern in SSD_FILES for p in directory.glob(pattern)})
            freed = sum(p.stat().st_size for p in files)
            for p in files:
                p.unlink()
            (directory / ".lock").unlink(missing_ok=True)
        print(f"removed {len(files)} SSD tier files ({freed >> 20} MiB) from {directory}")
    return 0


@contextlib.contextmanager
def _ssd_lock(directory: Path) -> Iterator[None]:
    """Hold the SSD directory's lock, which a daemon using the directory holds while it runs."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise KeyBusy(f"a running daemon uses {directory}: stop it before cleaning its SSD tier") from None
        yield
    finally:
        os.close(fd)
