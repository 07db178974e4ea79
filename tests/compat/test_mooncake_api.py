"""kvstore.compat.mooncake against a real `kvstore serve`: what the side-by-side test cannot ask
the real Mooncake Store (calls that crash it, kvstore-only settings), and the compatibility
table's kvstore-side rows."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

from kvstore.client import KVClient
from kvstore.compat.mooncake import ErrorCode, MooncakeDistributedStore, ObjectDataType, ReplicateConfig, SoftPinAction
from kvstore.compat.mooncake.unsupported import UNSUPPORTED
from tests.compat.conftest import MOONCAKE_MISSING

INVALID, NOT_FOUND = int(ErrorCode.INVALID_PARAMS), int(ErrorCode.OBJECT_NOT_FOUND)
NOT_SUPPORTED = int(ErrorCode.NOT_SUPPORTED)


def _store(meta: str, **kw) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup(kw.pop("host", "127.0.0.1"), "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", meta, **kw) == 0
    return s


@pytest.fixture
def store(kvstore_meta):
    s = _store(kvstore_meta)
    yield s
    s.close()


@pytest.fixture
def arena():
    """64 KiB of caller memory and its address."""
    buf = (ctypes.c_ubyte * (64 << 10))()
    return buf, ctypes.addressof(buf)


# -- calls Mooncake answers by crashing --------------------------------------------------------------


def test_every_call_before_setup_and_after_close_is_an_error_code_not_a_crash(kvstore_meta, arena):
    _, p = arena
    for s in (MooncakeDistributedStore(), _store(kvstore_meta)):
        s.close()
        assert [
            s.put("k", b"v"),
            s.put_batch(["k"], [b"v"]),
            s.put_from("k", p, 8),
            s.get_size("k"),
            s.get_into("k", p, 8),
            s.register_buffer(p, 64),
            s.unregister_buffer(p),
            s.remove("k"),
            s.remove_all(),
            s.is_exist("k"),
            s.upsert("k", b"v"),
        ] == [INVALID] * 11
        assert s.batch_is_exist(["a", "b"]) == [INVALID] * 2
        assert s.batch_put_from(["a"], [p], [8]) == s.batch_get_into(["a"], [p], [8]) == [INVALID]
        assert s.batch_put_from_multi_buffers(["a"], [[p]], [[8]]) == [INVALID]
        assert s.batch_get_into_multi_buffers(["a"], [[p]], [[8]]) == [INVALID]
        assert s.get("k") == b"" and s.get_batch(["a", "b"]) == [b"", b""] and s.get_buffer("k") is None
        assert s.health_check() == 1 and s.get_hostname() == "" and s.close() == 0


def test_null_unregistered_and_overrunning_pointers_are_invalid_params(store, arena):
    buf, p = arena
    assert store.register_buffer(0, 4096) == INVALID
    assert store.register_buffer(p, 4096) == 0
    assert store.put("k", b"12345678") == 0
    outside = p + 8192  # real memory, never registered
    for ptr, size in [(0, 8), (outside, 8), (p + 4090, 8), (-1, 8), (1 << 70, 8)]:
        assert store.put_from("bad", ptr, size) == INVALID
        assert store.get_into("k", ptr, size) == INVALID
        assert store.batch_put_from(["bad", "bad2"], [ptr, p], [size, 8]) == [INVALID, 0]
        assert store.batch_get_into(["k", "k"], [ptr, p + 100], [size, 8]) == [INVALID, 8]
        assert store.batch_put_from_multi_buffers(["bad"], [[p, ptr]], [[8, size]]) == [INVALID]
        assert store.batch_get_into_multi_buffers(["k"], [[p + 200, ptr]], [[4, size]]) == [INVALID]
    assert store.is_exist("bad") == 0
    assert bytes(buf[100:108]) == b"12345678"
    assert store.get_into_ranges([outside], [["k"]], [[[0]]], [[[0]]], [[[4]]]) == [[[INVALID]]]
    assert store.unregister_buffer(p) == 0
    assert store.get_into("k", p, 8) == INVALID  # unregistered again
    assert bytes(buf[8190:8200]) == bytes(10)  # nothing outside was ever written


def test_wrong_argument_types_raise_type_error_as_pybind11_does(store):
    for call in (
        lambda: store.put(1, b"x"),
        lambda: store.put("k", "text"),
        lambda: store.put("k", 5),
        lambda: store.batch_is_exist("abc"),
        lambda: store.put("k", b"x", config=3),
        lambda: store.batch_put_from(["k"], ["ptr"], [1]),
        lambda: store.setup("only", "two"),
        lambda: store.setup("h", "m", "big", 0, "tcp", "", "addr"),
    ):
        with pytest.raises(TypeError):
            call()
    cfg = ReplicateConfig()
    with pytest.raises(AttributeError):
        cfg.no_such_field = 1
    with pytest.raises(TypeError):
        cfg.replica_num = "two"  # type: ignore[assignment]  # the wrong type, on purpose


# -- setup ---------------------------------------------------------------------------------------


def test_setup_forms_and_failures(kvstore_meta, monkeypatch):
    s = MooncakeDistributedStore()
    assert (
        s.setup(
            {
                "local_hostname": "host-a",
                "metadata_server": "P2PHANDSHAKE",
                "master_server_addr": kvstore_meta,
                "global_segment_size": "1gb",
            }
        )
        == 0
    )
    assert s.get_hostname().startswith("host-a:") and s.health_check() == 0  # a port is added, as Mooncake does
    assert (
        s.setup(config={"local_hostname": "host-b:7000", "metadata_server": "x", "master_server_addr": kvstore_meta})
        == 0
    )
    assert s.get_hostname() == "host-b:7000"  # set up again: the old session is closed
    assert (
        s.setup(
            {"local_hostname": "h", "metadata_server": "x", "local_buffer_size": 10, "master_server_addr": kvstore_meta}
        )
        == INVALID
    )  # below Mooncake's 1 KiB minimum
    monkeypatch.setenv("KVSTORE_CLIENT_TIMEOUT_S", "1")
    assert s.setup("h", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", "127.0.0.1:1") == int(ErrorCode.RPC_FAIL)
    monkeypatch.setenv("KVSTORE_MOONCAKE_META", kvstore_meta)  # unchanged code, redirected
    assert s.setup("h", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", "127.0.0.1:1") == 0
    assert s.put("redirected", b"yes") == 0 and s.close() == 0


def test_health_check_sees_the_service_go(cluster):
    proc, meta = cluster.serve("32MiB")
    s = _store(meta)
    assert s.health_check() == 0
    proc.kill()
    assert s.health_check() == 2
    assert s.put("k", b"v") == int(ErrorCode.RPC_FAIL) and s.get("k") == b""
    assert s.is_exist("k") == int(ErrorCode.RPC_FAIL)
    s.close()


# -- keys: shared with native clients, tenants apart ------------------------------------------------


def test_default_tenant_keys_are_kvstore_keys_and_other_tenants_are_apart(kvstore_meta):
    native = KVClient(kvstore_meta)
    a, b = _store(kvstore_meta), _store(kvstore_meta, tenant_id="team-b")
    native.put("shared/native", b"from the SDK")
    assert a.get("shared/native") == b"from the SDK"
    assert a.put("shared/compat", b"from Mooncake's API") == 0
    assert native.get("shared/compat") == b"from Mooncake's API"
    assert b.is_exist("shared/compat") == 0 and b.put("shared/compat", b"team b") == 0
    assert a.get("shared/compat") == b"from Mooncake's API" and b.get("shared/compat") == b"team b"
    assert b.remove_all() == 1 and a.is_exist("shared/compat") == 1
    assert a.put("k" * 2000, b"v") == INVALID and a.is_exist("k" * 2000) == 0  # over 1024 bytes
    for s in (a, b, native):
        s.close()


def test_remove_all_reaches_every_key_of_its_namespace(kvstore_meta):
    a, other = _store(kvstore_meta, tenant_id="ra"), _store(kvstore_meta, tenant_id="ra")
    apart = _store(kvstore_meta, tenant_id="ra-apart")
    assert a.put_batch(["ra/1", "ra/2"], [b"1", b"2"]) == 0 and other.put("ra/3", b"3") == 0
    assert apart.put("ra/1", b"elsewhere") == 0
    assert a.remove("ra/1") == 0
    assert other.remove_by_regex("^ra/[3-9]") == 1 and a.batch_is_exist(["ra/2", "ra/3"]) == [1, 0]
    assert other.put("ra/4", b"4") == 0
    assert a.remove_all() == 2 and a.batch_is_exist(["ra/1", "ra/2", "ra/3", "ra/4"]) == [0, 0, 0, 0]
    assert a.remove_all() == 0 and apart.get("ra/1") == b"elsewhere"  # another namespace's keys stay
    a.close(), other.close(), apart.close()


# -- ReplicateConfig -------------------------------------------------------------------------------


def test_replicas_survive_a_daemon_killed(cluster):
    _, meta = cluster.meta()
    d1 = cluster.daemon(meta, "64MiB")
    cluster.daemon(meta, "64MiB")
    s = _store(meta)
    cfg = ReplicateConfig()
    cfg.replica_num = 2
    values = [bytes([i]) * (1000 + i) for i in range(20)]
    assert s.put_batch([f"rep/{i}" for i in range(20)], values, cfg) == 0
    d1.kill()
    assert s.get_batch([f"rep/{i}" for i in range(20)]) == values
    s.close()


def test_pins_follow_hard_and_soft_pin_settings(kvstore_meta):
    s, native = _store(kvstore_meta), KVClient(kvstore_meta)
    base = native.stats().pinned
    hard, soft, off, none = ReplicateConfig(), ReplicateConfig(), ReplicateConfig(), ReplicateConfig()
    hard.with_hard_pin = True
    soft.soft_pin_action, soft.soft_pin_ttl_ms = SoftPinAction.ENABLE, 60_000
    off.soft_pin_action = SoftPinAction.DISABLE
    assert s.put("pin/hard", b"h", hard) == 0 and s.put("pin/soft", b"s", soft) == 0
    assert s.put("pin/none", b"n", none) == 0
    assert native.stats().pinned == base + 2
    assert s.upsert("pin/soft", b"s2", off) == 0 and native.stats().pinned == base + 1
    nof = ReplicateConfig()
    nof.nof_replica_num = 1
    assert s.put("pin/nof", b"x", nof) == NOT_SUPPORTED and s.is_exist("pin/nof") == 0
    s.close()
    native.close()


def test_placement_hints_and_labels_are_accepted_and_change_nothing(store, arena):
    _, p = arena
    cfg = ReplicateConfig()
    cfg.preferred_segment, cfg.preferred_segments = "host-x:12345", ["host-y:1"]
    cfg.preferred_nof_segments, cfg.group_ids = ["nof-1"], ["group-a"]
    cfg.data_type = ObjectDataType.KVCACHE
    assert store.register_buffer(p, 64) == 0
    assert store.put("hint/1", b"one", cfg) == 0 and store.put_batch(["hint/2"], [b"two"], cfg) == 0
    assert store.batch_put_from(["hint/3"], [p], [8], cfg) == [0]
    assert store.batch_put_from_multi_buffers(["hint/4"], [[p, p + 8]], [[8, 8]], cfg) == [0]
    assert store.batch_is_exist(["hint/1", "hint/2", "hint/3", "hint/4"]) == [1, 1, 1, 1]


# -- values ---------------------------------------------------------------------------------------


def test_buffers_of_any_dtype_round_trip_as_their_bytes(store):
    weights = np.arange(1000, dtype=np.float32)
    assert store.put("np/f32", weights) == 0
    assert np.array_equal(np.frombuffer(store.get("np/f32"), dtype=np.float32), weights)
    assert store.get_size("np/f32") == weights.nbytes
    handle = store.get_buffer("np/f32")
    assert handle.size() == len(handle) == weights.nbytes and handle.ptr() != 0
    assert np.array_equal(np.frombuffer(handle, dtype=np.float32), weights)
    assert ctypes.string_at(handle.ptr(), 8) == weights.tobytes()[:8]


def test_threads_share_one_store(store):
    blocks = {f"thr/{t}/{i}": bytes([t, i]) * 2048 for t in range(4) for i in range(25)}
    arenas = [np.zeros(8192, dtype=np.uint8) for _ in range(4)]
    for a in arenas:
        assert store.register_buffer(a.ctypes.data, a.nbytes) == 0
    failures = []

    def work(t: int) -> None:
        a = arenas[t]
        for i in range(25):
            key = f"thr/{t}/{i}"
            a[:4096] = np.frombuffer(blocks[key], dtype=np.uint8)
            if (
                store.put_from(key, a.ctypes.data, 4096) != 0
                or store.get_into(key, a.ctypes.data + 4096, 4096) != 4096
                or bytes(a[4096:]) != blocks[key]
            ):
                failures.append(key)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not failures
    assert store.get_batch(list(blocks)) == list(blocks.values())


# -- the methods kvstore does not offer ---------------------------------------------------------------


def test_every_method_of_mooncakes_class_exists_here():
    if MOONCAKE_MISSING:
        pytest.skip("the real mooncake.store is not installed to list its methods")
    import mooncake.store as real

    theirs = {n for n in dir(real.MooncakeDistributedStore) if not n.startswith("_")}
    ours = {n for n in dir(MooncakeDistributedStore) if not n.startswith("_")}
    assert theirs - ours == set()
    implemented = theirs - set(UNSUPPORTED)
    assert set(UNSUPPORTED) <= theirs and "put_from" in implemented and "batch_get_into_multi_buffers" in implemented


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_methods_answer_not_supported(store, name):
    answer = getattr(store, name)(["k1", "k2"], [1, 2], [3, 4])
    shape = UNSUPPORTED[name]
    expected = {
        "int": NOT_SUPPORTED,
        "ints": [NOT_SUPPORTED] * 2,
        "none": None,
        "nones": [None, None],
        "empty_list": [],
        "empty_dict": {},
        "task": ((0, 0), NOT_SUPPORTED),
        "query": (None, NOT_SUPPORTED),
        "null_pointer": 0,
        "segment_dict": {"ret": NOT_SUPPORTED, "segment_ids": []},
        "alloc_dict": {"ret": NOT_SUPPORTED, "segment_ids": [], "allocated_size": 0},
    }[shape]
    assert answer == expected
