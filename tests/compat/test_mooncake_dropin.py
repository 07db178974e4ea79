"""Mooncake Store behaviours that code written for it (Mooncake's own wheel tests among it) relies
on, kept by kvstore.compat.mooncake against a real `kvstore serve`: how ReplicateConfig converts a
soft-pin TTL and which puts refuse one, the host:port name get_hostname answers, the bytes API
staged through a local buffer of local_buffer_size bytes, get_into_ranges' destinations bounded by
their own buffer, and (when asked for) the keys of a store's segment going when it closes.
Each was checked against Mooncake Store 0.3.13 (the installed wheel and its mooncake_master)."""

from __future__ import annotations

import ctypes
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kvstore.compat.mooncake import ErrorCode, MooncakeDistributedStore, ReplicateConfig, SoftPinAction
from tests.cluster import Cluster
from tests.compat.conftest import python_env

INVALID = int(ErrorCode.INVALID_PARAMS)
KiB, MiB = 1 << 10, 1 << 20


def _store(meta: str, host: str = "127.0.0.1", segment: int = 0, local_buffer: int = 16 * MiB):
    s = MooncakeDistributedStore()
    assert s.setup(host, "P2PHANDSHAKE", segment, local_buffer, "tcp", "", meta) == 0
    return s


def _config(action: SoftPinAction = SoftPinAction.PRESERVE, ttl_ms: int | None = None) -> ReplicateConfig:
    config = ReplicateConfig()
    config.soft_pin_action, config.soft_pin_ttl_ms = action, ttl_ms
    return config


# -- ReplicateConfig.soft_pin_ttl_ms ---------------------------------------------------------------


def test_soft_pin_ttl_is_none_or_an_unsigned_64_bit_int():
    config = ReplicateConfig()
    assert config.soft_pin_ttl_ms is None
    config.soft_pin_ttl_ms = 1000
    assert config.soft_pin_ttl_ms == 1000
    config.soft_pin_ttl_ms = (1 << 64) - 1
    assert config.soft_pin_ttl_ms == (1 << 64) - 1
    config.soft_pin_ttl_ms = None
    assert config.soft_pin_ttl_ms is None
    for bad in (-1, 1 << 64, 1.5, "1000", b"1"):
        with pytest.raises(TypeError):
            config.soft_pin_ttl_ms = bad  # type: ignore[assignment]  # the wrong value, on purpose
    assert config.soft_pin_ttl_ms is None  # a refused value changes nothing
    config.soft_pin_ttl_ms = True  # pybind11 converts a bool to an int
    assert config.soft_pin_ttl_ms == 1 and type(config.soft_pin_ttl_ms) is int


def test_a_soft_pin_ttl_is_refused_unless_the_action_is_enable(kvstore_meta):
    s = _store(kvstore_meta)
    try:
        buf = (ctypes.c_ubyte * 64)()
        p = ctypes.addressof(buf)
        assert s.register_buffer(p, 64) == 0
        for action in (SoftPinAction.PRESERVE, SoftPinAction.DISABLE):
            for ttl in (0, 1000):
                c = _config(action, ttl)
                tag = f"{action.name}/{ttl}"
                assert s.put(f"ttl/put/{tag}", b"v", c) == INVALID
                assert s.put_batch([f"ttl/batch/{tag}"], [b"v"], c) == INVALID
                assert s.put_parts(f"ttl/parts/{tag}", b"a", b"b", config=c) == INVALID
                assert s.put_from(f"ttl/from/{tag}", p, 8, c) == INVALID
                assert s.batch_put_from([f"ttl/bfrom/{tag}"], [p], [8], c) == [INVALID]
                assert s.batch_put_from_multi_buffers([f"ttl/multi/{tag}"], [[p]], [[8]], c) == [INVALID]
                assert (
                    s.batch_is_exist([f"ttl/{k}/{tag}" for k in ("put", "batch", "parts", "from", "bfrom", "multi")])
                    == [0] * 6
                )
        # An upsert so refused leaves the stored value as it was (it is not removed first).
        assert s.put("ttl/kept", b"old", _config(SoftPinAction.ENABLE, 1000)) == 0
        assert s.upsert("ttl/kept", b"new", _config(ttl_ms=1000)) == INVALID
        assert s.upsert_from("ttl/kept", p, 8, _config(SoftPinAction.DISABLE, 1000)) == INVALID
        assert s.get("ttl/kept") == b"old"
        # Without a TTL, or with ENABLE, the same calls go on (ENABLE with 0: no pin).
        assert s.upsert("ttl/kept", b"new") == 0 and s.get("ttl/kept") == b"new"
        assert s.upsert("ttl/kept", b"newer", _config(SoftPinAction.DISABLE)) == 0
        assert s.put("ttl/zero", b"v", _config(SoftPinAction.ENABLE, 0)) == 0
    finally:
        s.close()


# -- get_hostname ----------------------------------------------------------------------------------


def test_a_hostname_without_a_port_gets_one_in_mooncakes_range_held_while_set_up(kvstore_meta):
    a, b = _store(kvstore_meta, "localhost"), _store(kvstore_meta, "localhost")
    named = _store(kvstore_meta, "host-a:13999")
    try:
        names = [a.get_hostname(), b.get_hostname()]
        for name in names:
            host, port = name.rsplit(":", 1)
            assert host == "localhost" and 12300 <= int(port) <= 14300
        assert names[0] != names[1]  # one name per store, as Mooncake's segment names are
        with socket.socket() as probe, pytest.raises(OSError):
            probe.bind(("", int(names[0].rsplit(":", 1)[1])))  # the port is the store's while set up
        assert named.get_hostname() == "host-a:13999"  # a given port is kept as given
    finally:
        for s in (a, b, named):
            s.close()
    assert a.get_hostname() == ""


# -- the local buffer ------------------------------------------------------------------------------


def test_without_a_local_buffer_the_bytes_api_fails_and_registered_memory_still_works(kvstore_meta):
    writer, s = _store(kvstore_meta), _store(kvstore_meta, segment=64 * MiB, local_buffer=0)
    try:
        assert writer.put("lb0/there", b"hello") == 0
        assert s.put("lb0/k", b"v") == INVALID and s.is_exist("lb0/k") == 0
        assert s.put_batch(["lb0/b"], [b"v"]) == INVALID
        assert s.put_parts("lb0/p", b"a", b"b") == INVALID
        assert s.upsert("lb0/there", b"replaced") == INVALID and writer.get("lb0/there") == b"hello"
        assert s.batch_is_exist(["lb0/b", "lb0/p"]) == [0, 0]
        assert s.get("lb0/there") == b"" and s.get_batch(["lb0/there"]) == [b""]
        assert s.get_buffer("lb0/there") is None and s.batch_get_buffer(["lb0/there"]) == [None]
        assert s.get_size("lb0/there") == 5 and s.is_exist("lb0/there") == 1
        buf = (ctypes.c_ubyte * 64)()
        p = ctypes.addressof(buf)
        ctypes.memmove(p, b"zerocopy", 8)
        assert s.register_buffer(p, 64) == 0
        assert s.put_from("lb0/z", p, 8) == 0 and s.get_into("lb0/there", p, 64) == 5
        assert bytes(buf[:5]) == b"hello" and writer.get("lb0/z") == b"zerocopy"
    finally:
        writer.close()
        s.close()


def test_the_bytes_api_stages_each_call_through_the_local_buffer(kvstore_meta):
    writer, s = _store(kvstore_meta), _store(kvstore_meta, local_buffer=MiB)
    try:
        assert s.put("lb/1m", b"x" * MiB) == 0  # exactly the buffer
        assert s.put("lb/2m", b"x" * (2 * MiB)) == INVALID and s.is_exist("lb/2m") == 0
        # A batch is staged whole: together larger than the buffer, nothing of it is stored.
        assert s.put_batch(["lb/b1", "lb/b2"], [b"y" * (600 * KiB)] * 2) == INVALID
        assert s.batch_is_exist(["lb/b1", "lb/b2"]) == [0, 0]
        assert s.put_batch(["lb/c1", "lb/c2"], [b"y" * (400 * KiB)] * 2) == 0
        assert s.put_parts("lb/pp", b"a" * (600 * KiB), b"b" * (600 * KiB)) == INVALID
        assert writer.put("lb/g2", b"z" * (2 * MiB)) == 0
        assert s.get("lb/g2") == b"" and s.get_buffer("lb/g2") is None and s.get_size("lb/g2") == 2 * MiB
        # Reads take their room in order: the second 600 KiB value no longer fits.
        assert writer.put_batch(["lb/h1", "lb/h2"], [b"q" * (600 * KiB)] * 2) == 0
        assert [len(v) for v in s.get_batch(["lb/h1", "lb/h2"])] == [600 * KiB, 0]
        handles = s.batch_get_buffer(["lb/h1", "lb/h2"])
        assert handles[0] is not None and handles[0].size() == 600 * KiB and handles[1] is None
    finally:
        writer.close()
        s.close()


# -- get_into_ranges -------------------------------------------------------------------------------


def test_range_destinations_stay_inside_the_buffer_they_name(kvstore_meta):
    s = _store(kvstore_meta)
    try:
        arena = (ctypes.c_ubyte * 64)()
        first = ctypes.addressof(arena)
        second = first + 32
        assert s.register_buffer(first, 32) == 0 and s.register_buffer(second, 32) == 0  # back to back
        assert s.put("gr/k", b"0123456789") == 0
        # 4 bytes at offset 30 of the first buffer would run into the second: refused.
        assert s.get_into_ranges([first], [["gr/k"]], [[[30]]], [[[0]]], [[[4]]]) == [[[INVALID]]]
        assert bytes(arena[30:34]) == b"\0" * 4
        # Up to each buffer's own end, both take their fragment.
        both = s.get_into_ranges([first, second], [["gr/k"], ["gr/k"]], [[[28]], [[0]]], [[[0]], [[6]]], [[[4]], [[4]]])
        assert both == [[[4]], [[4]]]
        assert bytes(arena[28:36]) == b"01236789"
    finally:
        s.close()


# -- close: a segment's keys go with it (KVSTORE_MOONCAKE_DROP_ON_CLOSE) ---------------------------


def test_keys_outlive_the_store_that_put_them_by_default(kvstore_meta):
    a = _store(kvstore_meta, segment=64 * MiB)
    assert a.put("keep/k", b"v") == 0 and a.close() == 0
    b = _store(kvstore_meta)
    assert b.get("keep/k") == b"v"
    b.close()


def test_with_drop_on_close_a_store_with_a_segment_takes_the_keys_it_wrote_with_it(kvstore_meta, monkeypatch):
    monkeypatch.setenv("KVSTORE_MOONCAKE_DROP_ON_CLOSE", "1")
    other = _store(kvstore_meta)  # no segment: what it puts outlives it, as in Mooncake
    a = _store(kvstore_meta, "localhost", segment=64 * MiB)
    buf = (ctypes.c_ubyte * 64)()
    p = ctypes.addressof(buf)
    try:
        assert other.put("drop/theirs", b"theirs") == 0
        assert a.put("drop/theirs", b"mine") == 0  # already stored: not written, not a's
        assert a.put("drop/mine", b"mine") == 0 and a.put_batch(["drop/b1", "drop/b2"], [b"1", b"2"]) == 0
        assert a.register_buffer(p, 64) == 0 and a.put_from("drop/zc", p, 8) == 0
        assert a.put("drop/gone-before", b"x") == 0 and a.remove("drop/gone-before") == 0
        assert other.put("drop/gone-before", b"re-put by another") == 0
        assert a.close() == 0
        assert other.batch_is_exist(["drop/mine", "drop/b1", "drop/b2", "drop/zc"]) == [0, 0, 0, 0]
        assert other.get("drop/theirs") == b"theirs" and other.get("drop/gone-before") == b"re-put by another"
        # Set up again (Mooncake's test_client_tear_down): the old segment's key is gone, new puts work.
        assert _store_again(a, kvstore_meta) == 0
        assert a.get("drop/mine") == b"" and a.put("drop/mine", b"again") == 0 and a.get("drop/mine") == b"again"
        assert other.close() == 0
        assert a.get("drop/theirs") == b"theirs"  # a store without a segment left its keys
    finally:
        a.close()
        other.close()


def _store_again(s: MooncakeDistributedStore, meta: str) -> int:
    return s.setup("localhost", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", meta)


# -- Mooncake's own file, where one is at hand -----------------------------------------------------

WHEEL_TESTS = os.environ.get("KVSTORE_MOONCAKE_WHEEL_TESTS", "")


@pytest.mark.skipif(
    not WHEEL_TESTS,
    reason="set KVSTORE_MOONCAKE_WHEEL_TESTS to Mooncake's mooncake-wheel/tests/test_distributed_object_store.py",
)
@pytest.mark.timeout(600)
def test_mooncakes_own_wheel_tests_pass_unchanged():
    """docs/compat-mooncake.md's commands: the file, through the alias, against `kvstore serve`."""
    cluster = Cluster()
    try:
        _, meta = cluster.serve("2GiB")  # its stress test holds 800 MiB at once
        proc = subprocess.run(
            [sys.executable, "-m", "kvstore.compat.mooncake.run", WHEEL_TESTS],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            check=False,
            timeout=540,
            env=python_env(MASTER_SERVER=meta, KVSTORE_MOONCAKE_DROP_ON_CLOSE="1"),
        )
    finally:
        cluster.close()
    ran = re.search(r"Ran (\d+) tests?", proc.stderr)
    assert proc.returncode == 0 and ran is not None, proc.stderr[-6000:]
    assert int(ran.group(1)) >= 16 and proc.stderr.rstrip().endswith("OK"), proc.stderr[-6000:]
