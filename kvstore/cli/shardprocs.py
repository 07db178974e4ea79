"""`kvstore serve --shards S`: the metadata shards 1..S-1 as processes of their own (so one host
uses all its cores), shard 0 in the serving process, and the map that joins them.

Each shard process runs a MetaServer for shard I of S with the serving process's settings (any
port, no fixed admin or fast-lane port), says its address over a pipe, is told the whole map
once every shard is up, and stops when told to or when the serving process goes away (the pipe
closes). On Redis each shard also records its leader there, where clients started later find it.
"""

from __future__ import annotations

import multiprocessing
import signal
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from kvstore.cli.launch import start_meta
from kvstore.config import MetaConfig
from kvstore.errors import Unavailable

_START_TIMEOUT_S = 60.0


def shard_config(cfg: MetaConfig, index: int, count: int) -> MetaConfig:
    """Shard `index` of `count`, configured as `cfg` but on ports of its own (shard 0 keeps them)."""
    if index == 0:
        return replace(cfg, shard=f"0/{count}")
    return replace(
        cfg,
        shard=f"{index}/{count}",
        port=0,
        fast_lane_port=0,
        admin_port=0 if cfg.admin_port == 0 else -1,
        advertise="",
    )


def _run_shard(cfg: MetaConfig, conn: Connection) -> None:
    """A shard process: serve until told to stop (or the parent is gone)."""
    from kvstore.cli.stopping import StopSignals
    from kvstore.meta.shardmap import StaticShards

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us
    terminated = StopSignals((signal.SIGTERM,))  # a SIGTERM of its own stops it cleanly too
    try:
        meta = start_meta(cfg)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which says it
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", meta.address))
    try:
        while True:
            if terminated.fileno() in wait([conn, terminated.fileno()]):
                break
            what, value = conn.recv()
            if what == "map" and isinstance(meta.shards, StaticShards):
                meta.shards.update(value)
            elif what == "stop":
                break
    except EOFError:
        pass  # the serving process is gone
    finally:
        meta.stop()


class ShardProcesses:
    """Shards 1..count-1 of `cfg`'s store, each in its own process."""

    def __init__(self, cfg: MetaConfig, count: int) -> None:
        self._ctx = multiprocessing.get_context("spawn")  # a clean interpreter: no inherited threads
        self._procs: list[tuple[Any, Connection]] = []
        self.addresses: list[str] = []
        try:
            for i in range(1, count):
                parent, child = self._ctx.Pipe()
                proc = self._ctx.Process(
                    target=_run_shard, args=(shard_config(cfg, i, count), child), name=f"kvstore-meta-shard{i}"
                )
                proc.start()
                child.close()
                self._procs.append((proc, parent))
                if not parent.poll(_START_TIMEOUT_S):
                    raise Unavailable(f"metadata shard {i}/{count} did not start within {_START_TIMEOUT_S:.0f} s")
                try:
                    what, value = parent.recv()
                except EOFError:  # it died before it could say why
                    proc.join(5)
                    raise Unavailable(
                        f"metadata shard {i}/{count} exited (code {proc.exitcode}) before it started: see its log"
                    ) from None
                if what != "ready":
                    raise Unavailable(f"metadata shard {i}/{count} did not start: {value}")
                self.addresses.append(value)
        except BaseException:
            self.stop()
            raise

    def share_map(self, addresses: list[str]) -> None:
        for _, conn in self._procs:
            conn.send(("map", list(addresses)))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p, _ in self._procs if p.pid is not None]

    def stop(self) -> None:
        for _, conn in self._procs:
            try:
                conn.send(("stop", None))
            except OSError:
                pass  # already gone
        for proc, conn in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            conn.close()
        self._procs.clear()
