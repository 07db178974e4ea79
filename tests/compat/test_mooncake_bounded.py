"""The Mooncake-compatible layer holds no per-key state: the memory it keeps does not grow with the
keys put through it (remove_all and remove_by_regex list the store instead), and get_size asks
the service for the size without moving a byte of the value. Against a real `kvstore serve`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvstore.compat.mooncake import MooncakeDistributedStore
from kvstore.compat.mooncake.codes import ErrorCode

NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)


def _store(meta: str, segment: int = 0, **kw) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", segment, 16 << 20, "tcp", "", meta, **kw) == 0
    return s


def compat_entries(root: object) -> int:
    """Entries of every container held by the compat layer's objects reachable from `root`
    (kvstore.compat.* instances, through containers); other objects (the SDK client) are not
    followed: what the client caches is the client's, bounded by its own settings."""
    seen: set[int] = set()
    total = 0
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            total += len(obj)
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            total += len(obj)
            todo += list(obj)
        elif type(obj).__module__.startswith("kvstore.compat") and hasattr(obj, "__dict__"):
            todo += list(vars(obj).values())
    return total


@pytest.mark.parametrize("segment", [0, 64 << 20], ids=["no-segment", "segment"])
def test_memory_held_does_not_grow_with_the_keys_put(kvstore_meta, segment):
    """With a global segment too, unless KVSTORE_MOONCAKE_DROP_ON_CLOSE asks for the keys it
    wrote to be remembered (test_mooncake_dropin.py)."""
    s = _store(kvstore_meta, segment, tenant_id="bounded")
    try:
        assert s.put_batch([f"warm/{i}" for i in range(10)], [b"v"] * 10) == 0
        before = compat_entries(s)
        for batch in range(4):
            keys = [f"many/{batch}/{i}" for i in range(500)]
            assert s.put_batch(keys, [b"x" * 64] * 500) == 0
        assert s.batch_is_exist(["many/3/499", "warm/0"]) == [1, 1]
        assert compat_entries(s) == before, "the compat layer keeps something per key put"
        # What it no longer remembers, it lists: every key of its namespace, whoever wrote it.
        other = _store(kvstore_meta, tenant_id="bounded")
        assert other.put("by-another-instance", b"y") == 0
        assert s.remove_by_regex("^many/0/") == 500
        assert s.remove_all() == 10 + 3 * 500 + 1 and s.is_exist("by-another-instance") == 0
        assert compat_entries(s) == before
        other.close()
    finally:
        s.close()


def test_get_size_moves_no_value_bytes(kvstore_meta):
    s = _store(kvstore_meta, tenant_id="sizes")
    try:
        value = bytes(range(256)) * (64 << 10)  # 16 MiB
        assert s.put("big", value) == 0
        assert s._session is not None  # set up
        client = s._session.client
        reads: list[str] = []

        def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
            def call(*a: Any, **kw: Any) -> Any:
                reads.append(name)
                return original(*a, **kw)

            return call

        for name in ("get", "get_many", "get_into", "get_many_into"):
            setattr(client, name, counted(name, getattr(client, name)))
        before = _bytes_read(client)
        assert s.get_size("big") == len(value)
        assert s.get_size("absent") == NOT_FOUND
        assert reads == [] and _bytes_read(client) == before
        assert s.get("big") == value and reads and _bytes_read(client) >= before + len(value)  # the counter counts
    finally:
        s.close()


def _bytes_read(client) -> int:
    assert client.metrics is not None
    return sum(n for (_, _, direction), (_, n, _) in client.metrics.totals().items() if direction == "get")
