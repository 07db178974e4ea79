"""kvstore.blockhash: the chained block hash that engines, the indexer and the router share."""

from __future__ import annotations

import pytest

from kvstore import blockhash
from kvstore.engines.keys import KeyScheme


def test_the_hash_is_pinned():
    # Stored blocks are named by these bytes: a change here orphans every block already stored.
    assert blockhash.root(32).hex() == "06d535d8dd05a928cae5092cc46ee0df"
    assert blockhash.chain(list(range(8)), 4, seed=7, extra=b"lora=a")[1].hex() == "12a7d3efecee95bf7f3d6dc5e374a95b"


def test_the_engines_key_scheme_uses_it():
    scheme = KeyScheme(model="org/m", layout="l", block_size=4, tenant="t", seed=7)
    tokens = list(range(13))
    assert scheme.block_hashes(tokens, b"x") == blockhash.chain(tokens, 4, 7, b"x")
    assert scheme.namespace == blockhash.namespace("t", "org/m", "l") == "t/org%2Fm/l"


def test_chains_continue_from_a_parent():
    tokens = list(range(12))
    whole = blockhash.chain(tokens, 4)
    assert blockhash.chain(tokens[4:], 4, parent=whole[0]) == whole[1:]


def test_short_is_vllms_int_conversion():
    digest = bytes(range(16))
    assert blockhash.short(digest) == int.from_bytes(digest[8:], "big")


def test_extra_key_matches_the_connectors_encoding():
    assert blockhash.extra_key() == b""
    assert blockhash.extra_key("sql", "w8a8") == b"lora=sql|salt=w8a8"
    assert blockhash.extra_key(None, "s") == b"salt=s"


def test_bad_block_size_is_refused():
    with pytest.raises(ValueError):
        blockhash.chain([1, 2], 0)
