"""Tenant isolation through real processes: tenant b cannot read, remove, pin, test the existence
of, prefix-match or get stats on tenant a's keys, even named exactly; a key held by a and one
nobody holds get identical answers from b, in indistinguishable time; keys crafted to escape a
namespace are refused or stay in the caller's own."""

from __future__ import annotations

import statistics
import time

import pytest

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import InvalidArgument, KeyNotFound

PROBES = 1200


def client(address: str, token: str, **settings) -> KVClient:
    return KVClient(address, ClientConfig(token=token, transports=("tcp", "shm"), **settings))


def answers(b: KVClient, key: str) -> tuple:
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


def test_probe_timing_does_not_tell_held_from_absent(tenants):
    """For b, exists and get of keys a holds and of keys nobody holds: identical answers, and
    medians of >= 1000 interleaved calls each within noise of one another."""
    address, made = tenants
    with client(address, made["a"]) as a, client(address, made["b"]) as b:
        held = [f"probe/held/{i}" for i in range(PROBES)]
        for start in range(0, PROBES, 400):
            a.put_many(held[start : start + 400], [b"x" * 64] * 400)
        absent = [f"probe/none/{i}" for i in range(PROBES)]
        for name, probe in (("exists", lambda k: b.exists_many([k])), ("get", lambda k: _miss(b, k))):
            times: dict[str, list[float]] = {"held": [], "absent": []}
            answers_seen = set()
            for i in range(PROBES):
                order = (("held", held[i]), ("absent", absent[i])) if i % 2 else (("absent", absent[i]), ("held", held[i]))
                for kind, key in order:
                    started = time.perf_counter()
                    answers_seen.add(str(probe(key)).replace(key, "KEY"))
                    times[kind].append(time.perf_counter() - started)
            assert len(answers_seen) == 1, answers_seen
            m_held, m_absent = statistics.median(times["held"]), statistics.median(times["absent"])
            print(f"{name}: median held {m_held * 1e6:.1f} us, absent {m_absent * 1e6:.1f} us, "
                  f"ratio {m_held / m_absent:.3f} over {PROBES} calls each")  # fmt: skip
            # Within noise: the two medians of interleaved calls are as close as two samples of
            # one distribution (a generous bound on a shared 2-core machine).
            assert 0.8 < m_held / m_absent < 1.25, (name, m_held, m_absent)


def _miss(b: KVClient, key: str) -> str:
    try:
        b.get(key)
    except KeyNotFound as exc:
        return str(exc)
    return "found"
