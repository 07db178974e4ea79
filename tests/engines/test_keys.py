import subprocess
import sys

import pytest

from kvstore.engines.keys import KeyScheme

SCHEME = KeyScheme(model="m", layout="l", block_size=4, tenant="t", seed=7)


def test_only_full_blocks_are_named_and_chained():
    tokens = list(range(11))
    hashes = SCHEME.block_hashes(tokens)
    assert len(hashes) == 2  # 11 // 4; the partial block is not named
    assert SCHEME.block_hashes(tokens[:8]) == hashes  # a prefix gives the same leading keys
    changed = SCHEME.block_hashes([99, *tokens[1:]])
    assert changed[0] != hashes[0] and changed[1] != hashes[1]  # a change propagates down the chain
    later = SCHEME.block_hashes([*tokens[:4], 99, *tokens[5:]])
    assert later[0] == hashes[0] and later[1] != hashes[1]


def test_extra_seed_and_namespace_separate_keys():
    tokens = list(range(8))
    assert SCHEME.block_hashes(tokens, extra=b"lora-1") != SCHEME.block_hashes(tokens)
    other_seed = KeyScheme(model="m", layout="l", block_size=4, tenant="t", seed=8)
    assert other_seed.block_hashes(tokens) != SCHEME.block_hashes(tokens)
    other_tenant = KeyScheme(model="m", layout="l", block_size=4, tenant="u", seed=7)
    assert other_tenant.block_keys(tokens) != SCHEME.block_keys(tokens)
    assert other_tenant.fingerprint != SCHEME.fingerprint
    slashed = KeyScheme(model="org/model", layout="l", block_size=4)
    assert slashed.namespace.count("/") == 2  # '/' in a component is quoted


def test_object_keys_are_block_major():
    hashes = SCHEME.block_hashes(list(range(8)))
    keys = SCHEME.object_keys(hashes, [0, 1])
    assert keys == [
        SCHEME.key(hashes[0], 0),
        SCHEME.key(hashes[0], 1),
        SCHEME.key(hashes[1], 0),
        SCHEME.key(hashes[1], 1),
    ]
    assert SCHEME.object_keys(hashes) == [SCHEME.key(h) for h in hashes]


def test_keys_do_not_depend_on_pythonhashseed():
    code = (
        "from kvstore.engines.keys import KeyScheme;"
        "print(KeyScheme(model='m', layout='l', block_size=4, seed=7, tenant='t').block_keys(list(range(9))))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str(SCHEME.block_keys(list(range(9))))


def test_bad_scheme_is_refused():
    with pytest.raises(ValueError):
        KeyScheme(model="m", layout="l", block_size=0)
    with pytest.raises(ValueError):
        KeyScheme(model="", layout="l", block_size=4)
