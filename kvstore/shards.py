"""Which metadata shard owns a key, and the shard map clients and daemons route by.

The key space is split into S shards, each an independent metadata service (its own index,
allocator and eviction over its own segments of every daemon, its own leader and standbys, its
own Redis keys). A key's shard is `xxh3_64(tag) % S`, where `tag` is the key's hash tag (the
text between the first "{" and the next "}", when that is not empty, as in Redis Cluster) or else
the whole key. Keys that share a hash tag share a shard: an engine that tags every block of a
prefix chain with the chain's first block keeps match_prefix one call (at the price of a hot
shard for a hot prefix); untagged keys spread evenly, and a batch fans out to its shards at once.

Doubling the shards (S -> 2S) keeps a key on shard i or moves it to shard i + S, never
elsewhere: resharding moves about half of each shard's keys, each to one new shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from kvstore.errors import InvalidArgument

_REMEMBERED = 1 << 16  # keys whose shard a table remembers (engines ask for the same chains again)


def hash_tag(key: str) -> str:
    """The part of `key` that decides its shard."""
    if "{" not in key:
        return key
    start = key.find("{")
    end = key.find("}", start + 1)
    return key[start + 1 : end] if end > start + 1 else key


def _hash(key: str, count: int) -> int:
    return xxhash.xxh3_64_intdigest(hash_tag(key).encode("utf-8", "surrogatepass")) % count


class _ShardTable(dict[str, int]):
    """key -> its shard of `count`, computed once per key (a dict lookup costs ~1/10 of the
    hash); forgets everything past _REMEMBERED keys."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def __missing__(self, key: str) -> int:
        if len(self) >= _REMEMBERED:
            self.clear()
        shard = self[key] = _hash(key, self.count)
        return shard


_TABLES: dict[int, _ShardTable] = {}


def _table(count: int) -> _ShardTable:
    table = _TABLES.get(count)
    if table is None:
        table = _TABLES.setdefault(count, _ShardTable(count))
    return table


def shard_of(key: str, count: int) -> int:
    if count == 1:
        return 0
    return _table(count)[key]


def split(keys: Sequence[str], count: int) -> dict[int, list[int]]:
    """shard -> the positions in `keys` of the keys it owns (in order)."""
    if count == 1 or not keys:
        return {0: list(range(len(keys)))} if keys else {}
    owners = list(map(_table(count).__getitem__, keys))
    first = owners[0]
    if owners.count(first) == len(owners):  # a tagged chain: one shard
        return {first: list(range(len(keys)))}
    out: dict[int, list[int]] = {}
    for i, shard in enumerate(owners):
        out.setdefault(shard, []).append(i)
    return out


def foreign(keys: Sequence[str], index: int, count: int) -> str | None:
    """The first of `keys` that shard `index` of `count` does not own, or None."""
    if count == 1:
        return None
    table = _table(count)
    return next((k for k, shard in zip(keys, map(table.__getitem__, keys)) if shard != index), None)


@dataclass(frozen=True)
class ShardSpec:
    """This service's place in the map: shard `index` of `count`."""

    index: int = 0
    count: int = 1

    @staticmethod
    def parse(text: str) -> ShardSpec:
        """ "I/S" (e.g. "0/4"); "" is the only shard of one."""
        if not text:
            return ShardSpec()
        index, sep, count = text.partition("/")
        try:
            spec = ShardSpec(int(index), int(count))
        except ValueError:
            raise InvalidArgument(f"shard {text!r}: write it I/S, e.g. 0/4 (shard 0 of 4)") from None
        if not sep or not 0 <= spec.index < spec.count or spec.count > 1024:
            raise InvalidArgument(f"shard {text!r}: need 0 <= I < S <= 1024")
        return spec

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, key: str) -> bool:
        return self.count == 1 or shard_of(key, self.count) == self.index


@dataclass(frozen=True)
class ShardMap:
    """Every shard's service address (its leader's, as far as the answering service knows), and
    the map's epoch, which grows whenever the map changes (kvstore/meta/shardmap.py): a service
    answers WRONG_SHARD to a key it does not own, naming its epoch, and a client whose map is no
    newer reads the map again."""

    addresses: tuple[str, ...]
    epoch: int = 0

    @property
    def count(self) -> int:
        return len(self.addresses)

    def missing(self, own: int) -> list[int]:
        """The shards other than `own` the map has no address for yet (their leaders are being
        elected, or `kvstore serve --shards` has not shared the map yet)."""
        return [i for i, address in enumerate(self.addresses) if i != own and not address]
