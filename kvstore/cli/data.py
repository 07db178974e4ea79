"""`kvstore put`, `get`, `rm`, `ls` and `stat`: a person's view of the store's keys.

`put` keeps the content-addressed rule of the store (a key names its bytes, so a stored key is
not rewritten): a put of a stored key keeps it and exits 3 (Exit.EXISTS) unless --replace is
given, which removes the old value first. A key that is not stored makes get, rm and stat KEY
exit 4 (Exit.NOT_FOUND).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kvstore.cli.exits import Exit
from kvstore.config import DEFAULT_META_PORT, META_ENV, ClientConfig
from kvstore.config.flags import ConfigFlags
from kvstore.errors import InvalidArgument
from kvstore.observe import METRICS_ENDPOINT

if TYPE_CHECKING:
    from kvstore.client import KVClient
    from kvstore.results import KeyInfo, StoreStats

DEFAULT_META = f"127.0.0.1:{DEFAULT_META_PORT}"


def add_command(name: str, sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--meta", help=f"metadata service address (default: {DEFAULT_META}; env {META_ENV})")
    sp.add_argument("--config", metavar="FILE", help="TOML file with a [client] table")
    if name == "put":
        sp.add_argument("key")
        sp.add_argument("value", nargs="?", help="the value as text (or --file, or stdin)")
        sp.add_argument("--file", help="read the value from this file")
        how = sp.add_mutually_exclusive_group()
        how.add_argument("--if-absent", action="store_true", help="keep a stored key and exit 3 (the default)")
        how.add_argument("--replace", action="store_true", help="remove a stored key first, then store the value")
    elif name == "get":
        sp.add_argument("key")
        sp.add_argument("--out", help="write the value to this file instead of stdout")
    elif name == "rm":
        sp.add_argument("key", nargs="+")
        sp.add_argument("--force", action="store_true", help="remove even keys being read (their space waits)")
    elif name == "ls":
        sp.add_argument("prefix", nargs="?", default="", help="only keys that start with this")
        sp.add_argument("--limit", type=int, default=0, help="at most this many keys (default: all)")
        sp.add_argument("-l", "--long", action="store_true", help="also each key's size in bytes")
    elif name == "stat":
        sp.add_argument("key", nargs="*", help="describe these keys: size, tiers, replicas, lease and pin")
        sp.add_argument("--json", action="store_true")
    flags = ConfigFlags()
    flags.add(sp, ClientConfig)
    sp.set_defaults(run=COMMANDS[name], flags=flags)


def _client(args: argparse.Namespace) -> KVClient:
    from kvstore.client import KVClient

    cfg = args.flags.load(ClientConfig, args)
    return KVClient(args.meta or os.environ.get(META_ENV) or DEFAULT_META, cfg)


def cmd_put(args: argparse.Namespace) -> int:
    if args.file:
        with open(args.file, "rb") as fh:
            value = fh.read()
    elif args.value is not None:
        value = args.value.encode()
    else:
        value = sys.stdin.buffer.read()
    if not value:
        raise InvalidArgument("the value is empty: kvstore stores at least one byte")
    with _client(args) as client:
        if args.replace:
            err = client.remove_many([args.key])[0]
            if err is not None and err.code.name != "KEY_NOT_FOUND":
                raise err
        if not client.put(args.key, value):
            print(f"kept: {args.key} is already stored (pass --replace to overwrite it)", file=sys.stderr)
            return Exit.EXISTS
    print(f"stored: {args.key} ({len(value)} bytes)")
    return Exit.OK


def cmd_get(args: argparse.Namespace) -> int:
    with _client(args) as client:
        value = client.get(args.key)
    if args.out:
        with open(args.out, "wb") as fh:
            fh.write(value)
        print(f"{args.key}: {len(value)} bytes -> {args.out}")
    else:
        sys.stdout.buffer.write(value)
        if sys.stdout.isatty():
            sys.stdout.write("\n")
    return Exit.OK


def cmd_rm(args: argparse.Namespace) -> int:
    with _client(args) as client:
        errors = client.remove_many(args.key, args.force)
    code = Exit.OK
    for key, err in zip(args.key, errors):
        if err is None:
            print(f"removed: {key}")
        else:
            print(f"{key}: {type(err).__name__}: {err}", file=sys.stderr)
            code = max(code, Exit.NOT_FOUND if err.code.name == "KEY_NOT_FOUND" else Exit.ERROR)
    return code


def cmd_ls(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise InvalidArgument("--limit must not be negative")
    shown = 0
    with _client(args) as client:
        cursor = ""
        while True:
            want = min(args.limit - shown, 1000) if args.limit else 1000
            page = client.list_keys(args.prefix, want, cursor)
            for key, size in zip(page.keys, page.sizes):
                print(f"{size:>12}  {key}" if args.long else key)
            shown += len(page.keys)
            if not page.next_cursor or (args.limit and shown >= args.limit):
                return Exit.OK
            cursor = page.next_cursor


def cmd_stat(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.key:
            infos = client.describe(args.key)
            return _show_keys(infos, args.json)
        stats = client.stats()
    if args.json:
        print(json.dumps(asdict(stats), default=str, indent=2))
    else:
        _show_stats(stats)
    return Exit.OK


def _show_keys(infos: list[KeyInfo], as_json: bool) -> int:
    from kvstore.results import KeyState

    if as_json:
        print(json.dumps([_jsonable(asdict(i)) for i in infos], indent=2))
    for info in infos if not as_json else ():
        if info.state is KeyState.ABSENT:
            print(f"{info.key}: absent")
            continue
        tiers = ",".join(t.value for t in info.tiers) or "none"
        replicas = ", ".join(f"{r.daemon_id}/{r.segment_id} ({r.tier.value})" for r in info.replicas)
        wanted = f" of {info.wanted_replicas} wanted" if info.wanted_replicas else ""
        lease = f"leased {info.lease_s:.1f}s more" if info.lease_s else "not leased"
        pin = f"pinned {info.pin_s:.1f}s more" if info.pin_s else "not pinned"
        moving = ", moving" if info.moving else ""
        print(f"{info.key}: {info.state.value}, {info.size} bytes, tier {tiers}, {lease}, {pin}{moving}")
        print(f"  replicas {len(info.replicas)}{wanted}: {replicas}")
    return Exit.NOT_FOUND if any(i.state is KeyState.ABSENT for i in infos) else Exit.OK


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return getattr(value, "value", value)


def _show_stats(stats: StoreStats) -> None:
    if stats.role:  # on Redis: the election, Redis, and what a takeover left to reconcile
        writes = "open" if stats.writes_open else "refused (the journal on Redis is failing)"
        print(
            f"service {stats.role}, epoch {stats.epoch}, leader {stats.leader or 'none'}, standbys "
            f"{', '.join(stats.standbys) or 'none'}; redis {stats.redis or 'unknown'}; writes {writes}; "
            f"segments reconciling {stats.reconciling}"
        )
    pct = 100 * stats.used / stats.capacity if stats.capacity else 0.0
    if stats.tenant:  # a tenant's own view: capacities are its quotas (0: none)
        print(f"tenant {stats.tenant} (its own keys only; capacity = its quotas)")
    print(
        f"keys {stats.keys} (+{stats.pending} being written), used {stats.used >> 20} of "
        f"{stats.capacity >> 20} MiB ({pct:.1f}%), evictions {stats.evictions}, "
        f"revoked puts {stats.revoked_puts}, leased {stats.leased}, pinned {stats.pinned}"
    )
    for t in stats.tiers:
        print(
            f"  tier {t.tier.value}: {t.used >> 20}/{t.capacity >> 20} MiB, blocks {t.blocks}, hits {t.hits}, "
            f"evictions {t.evictions}, demotions {t.demotions}, promotions {t.promotions}"
        )
    for d in stats.daemons:
        # a daemon's /metrics travels as an endpoint, but is no transport
        transports = sorted({e.transport for s in d.segments for e in s.endpoints} - {METRICS_ENDPOINT})
        print(
            f"  daemon {d.daemon_id}: {len(d.segments)} segments, "
            f"{sum(s.capacity for s in d.segments) >> 20} MiB, transports {', '.join(transports)}"
        )
    if stats.per_shard:  # a sharded store: each shard's load, and how evenly the keys spread
        mean = stats.keys / len(stats.per_shard)
        for s in stats.per_shard:
            skew = f"{100 * (s.keys - mean) / mean:+.1f}%" if mean else "n/a"
            lead = f", {s.role} epoch {s.epoch}" if s.role else ""
            print(
                f"  shard {s.shard}/{stats.shards}: keys {s.keys} ({skew} of the mean), used {s.used >> 20} of "
                f"{s.capacity >> 20} MiB, leased {s.leased}, pending {s.pending}{lead}"
            )


COMMANDS = {"put": cmd_put, "get": cmd_get, "rm": cmd_rm, "ls": cmd_ls, "stat": cmd_stat}
