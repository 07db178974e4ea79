"""Tenant isolation through real processes: tenant b cannot list, read, remove, pin, test the
existence of, prefix-match, describe or get stats on tenant a's keys, even named exactly, one by
one or in batches; a key held by a and one nobody holds get identical answers from b; keys
crafted to escape a namespace are refused or stay in the caller's own. The side channels that
remain (shared capacity and LRU, store-wide NoSpace, load) are listed in docs/security.md."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, KeyNotFound
from kvstore.results import KeyState


def client(address: str, token: str, **settings) -> KVClient:
    return KVClient(address, ClientConfig(token=token, transports=("tcp", "shm"), **settings))


def answers(b: KVClient, key: str) -> tuple[Any, ...]:
    """Everything b can learn of `key` without writing it."""
    try:
        b.get(key)
        got = "value"
    except KeyNotFound as exc:
        got = str(exc).replace(repr(key), "KEY")
    removed = b.remove_many([key])[0]
    pinned = b.pin([key], 1.0)[0]
    return (
        b.exists_many([key]),
        b.match_prefix([key, key + "/next"]),
        got,
        None if removed is None else (type(removed), str(removed).replace(repr(key), "KEY")),
        None if pinned is None else (type(pinned), str(pinned).replace(repr(key), "KEY")),
        [i.state for i in b.describe([key])],
        b.list_keys(key).keys,
    )


def test_b_learns_nothing_of_as_keys_even_named_exactly(tenants):
    address, made = tenants
    with client(address, made["a"]) as a, client(address, made["b"]) as b:
        a.put_many([f"secret/prompt/{i}" for i in range(3)], [b"a's bytes %d" % i for i in range(3)])
        before = b.stats()
        held = answers(b, "secret/prompt/1")
        nobody = answers(b, "secret/nobody/1")
        assert held == nobody
        assert held[0] == [False] and held[1] == 0 and held[6] == ()
        after = b.stats()
        assert (before.keys, before.used, after.keys, after.used) == (0, 0, 0, 0)
        # b's put of the same key is its own object: a's bytes are untouched
        b.put("secret/prompt/1", b"b's bytes")
        assert b.get("secret/prompt/1") == b"b's bytes"
        assert a.get("secret/prompt/1") == b"a's bytes 1"
        b.remove_many(["secret/prompt/1"])
        assert a.exists_many([f"secret/prompt/{i}" for i in range(3)]) == [True] * 3


@pytest.mark.parametrize(
    "key",
    ["../secret/prompt/1", "secret/prompt/1/..", "./secret/prompt/1", "secret\\prompt\\1", "ѕecret/prompt/1",
     "secret/prompt/1\u200b", "secret/prompt/１", "\ufeffsecret/prompt/1"],
)  # fmt: skip
def test_keys_that_look_like_as_are_bs_own(tenants, key):
    address, made = tenants
    with client(address, made["a"]) as a, client(address, made["b"]) as b:
        if not a.exists_many(["secret/prompt/1"])[0]:
            a.put("secret/prompt/1", b"a's")
        assert b.exists_many([key]) == [False]
        b.put(key, b"b's own")
        assert b.get(key) == b"b's own" and a.get("secret/prompt/1") in (b"a's", b"a's bytes 1")
        assert a.exists_many([key]) == [False]
        b.remove_many([key])


@pytest.mark.parametrize("key", ["\0secret", "secret\0prompt", "\x001\x00secret/prompt/1", "k" * 1025, ""])
def test_keys_that_could_escape_a_namespace_are_refused(tenants, key):
    address, made = tenants
    with client(address, made["b"], fast_lane=False) as b:
        for probe in (lambda: b.exists_many([key]), lambda: b.get(key), lambda: b.put(key, b"x")):
            with pytest.raises(InvalidArgument):
                probe()


def test_b_cannot_list_read_or_detect_as_keys_in_bulk(tenants):
    """What isolation promises, over many keys: b's listings (every page and every cursor) name
    only b's keys, even where a's keys sort between them; a's keys, probed by b in batches, answer
    exactly as names nobody holds, for exists, match_prefix, describe and get; b's buffers stay
    untouched; b's stat counts only b's keys. (Probe timing is not measured: b's probes look up b's
    own namespaced keys, whatever a holds; docs/security.md lists the channels that do exist.)"""
    address, made = tenants
    with client(address, made["a"]) as a, client(address, made["b"]) as b:
        held = [f"bulk/{i:03d}" for i in range(200)]
        a.put_many(held, [b"a's %d" % i for i in range(200)])
        mine = [f"bulk/{i:03d}b" for i in range(0, 200, 9)]  # sort between a's keys
        keys_before = b.stats().keys
        b.put_many(mine, [b"b's"] * len(mine))
        try:
            pages, cursor = [], ""
            while True:
                page = b.list_keys("bulk/", 7, cursor)
                pages.append(page)
                if not page.next_cursor:
                    break
                assert page.next_cursor in mine, "a cursor named a key b does not hold"
                cursor = page.next_cursor
            assert [k for p in pages for k in p.keys] == sorted(mine)
            assert set(b.iter_keys()) >= set(mine) and not set(b.iter_keys()) & set(held)
            assert b.list_keys("bulk/0", 1000).keys == tuple(sorted(k for k in mine if k.startswith("bulk/0")))

            nobody = [f"bulk/{i:03d}" for i in range(200, 400)]
            for names in (held, nobody):
                assert b.exists_many(names) == [False] * len(names)
                assert b.match_prefix(names) == 0
                assert {i.state for i in b.describe(names)} == {KeyState.ABSENT}
                buffers = [bytearray(16) for _ in names[:50]]
                got = b.get_many_into(names[:50], buffers, strict=False)
                assert all(isinstance(r, KeyNotFound) for r in got)
                assert buffers == [bytearray(16)] * 50
            assert b.stats().keys == keys_before + len(mine)
        finally:
            b.remove_many(mine)
            a.remove_many(held)
