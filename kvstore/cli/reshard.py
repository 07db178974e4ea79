"""`kvstore reshard`: move every committed key of one namespace from a store to another store of
another shard count (S -> 2S), checked key by key, then say how long the keys were in transit.

A shard's keys live in the segments its daemons offer that shard, so a key cannot change shard
in place: resharding copies each key (its bytes, checksum-verified on read) into the new store,
whose client routes it to its new shard, and checks the new store holds every key with the same
size and checksum before it reports success. The old store is left as it was: an operator points
clients at the new store once the copy is done, then stops the old one (docs/sharding.md).
Keys written to the old store after their page was copied are not moved: stop writers first, or
run it again (a key already in the new store with the same checksum is skipped).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import TYPE_CHECKING

from kvstore.cli.exits import Exit
from kvstore.config import META_ENV, ClientConfig
from kvstore.config.flags import ConfigFlags
from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.results import KeyState

if TYPE_CHECKING:
    from kvstore.client import KVClient

_PAGE = 256


def add_command(name: str, sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--from", dest="source", help=f"the store to move keys out of (default: env {META_ENV})")
    sp.add_argument("--to", dest="target", required=True, help="the store (of the new shard count) to move them into")
    sp.add_argument("--prefix", default="", help="only keys starting with this (default: every key)")
    sp.add_argument("--batch", type=int, default=_PAGE, help=f"keys per copy step (default {_PAGE})")
    flags = ConfigFlags()
    flags.add(sp, ClientConfig)
    sp.set_defaults(run=cmd_reshard, flags=flags)


def cmd_reshard(args: argparse.Namespace) -> int:
    from kvstore.client import KVClient

    source = args.source or os.environ.get(META_ENV)
    if not source:
        raise InvalidArgument(f"give --from ADDRESS (or set {META_ENV}): the store to move keys out of")
    if not 1 <= args.batch <= 4096:
        raise InvalidArgument("--batch: 1 to 4096 keys per step")
    cfg = args.flags.load(ClientConfig, args)
    started = time.monotonic()
    copied = skipped = moved_bytes = 0
    with KVClient(source, cfg) as old, KVClient(args.target, cfg) as new:
        print(f"resharding {source} ({old.meta.shard_count} shard(s)) -> {args.target} "
              f"({new.meta.shard_count} shard(s)), prefix {args.prefix!r}", flush=True)  # fmt: skip
        cursor = ""
        while True:
            page = old.list_keys(args.prefix, args.batch, cursor)
            if page.keys:
                c, s, b = _copy(old, new, list(page.keys))
                copied, skipped, moved_bytes = copied + c, skipped + s, moved_bytes + b
            if not page.next_cursor:
                break
            cursor = page.next_cursor
        missing = _verify(old, new, args.prefix, args.batch)
    took = time.monotonic() - started
    rate = moved_bytes / took / (1 << 20) if took else 0.0
    print(
        f"copied {copied} keys ({moved_bytes >> 20} MiB, {rate:.0f} MiB/s), {skipped} already there, in {took:.1f} s "
        "(the longest any key was readable from the old store only)"
    )
    if missing:
        print(f"NOT resharded: {len(missing)} keys differ in the new store, e.g. {missing[:5]}")
        return Exit.ERROR
    print("every key is in the new store with its size and checksum: point clients at it, then stop the old store")
    return Exit.OK


def _copy(old: KVClient, new: KVClient, keys: list[str]) -> tuple[int, int, int]:
    """(copied, already there, bytes) for one page of keys. A key the new store holds with other
    bytes (put there meanwhile) is replaced by the old store's."""
    mine = {i.key: i.checksum for i in old.describe(keys) if i.state is KeyState.COMPLETE}
    there = {i.key: i.checksum for i in new.describe(keys) if i.state is KeyState.COMPLETE}
    todo = [k for k in keys if k in mine and there.get(k) != mine[k]]
    stale = [k for k in todo if k in there]
    if stale:
        new.remove_many(stale, force=True)
    if not todo:
        return 0, len(mine), 0
    data = old.get_many(todo)  # checksum-verified on read
    try:
        new.put_many(todo, data)
    except KVStoreError as exc:
        raise KVStoreError(f"copying {len(todo)} keys into the new store: {exc}") from exc
    return len(todo), len(mine) - len(todo), sum(len(d) for d in data)


def _verify(old: KVClient, new: KVClient, prefix: str, batch: int) -> list[str]:
    """Keys of the old store the new one lacks, or holds with another size or checksum."""
    missing: list[str] = []
    cursor = ""
    while True:
        page = old.list_keys(prefix, batch, cursor)
        keys = list(page.keys)
        if keys:
            theirs = {i.key: (i.size, i.checksum) for i in new.describe(keys) if i.state is KeyState.COMPLETE}
            for info in old.describe(keys):
                if info.state is KeyState.COMPLETE and theirs.get(info.key) != (info.size, info.checksum):
                    missing.append(info.key)
        if not page.next_cursor:
            return missing
        cursor = page.next_cursor
