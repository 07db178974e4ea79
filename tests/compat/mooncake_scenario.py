"""One fixed sequence of Mooncake Store API calls, run against either the real Mooncake Store or
kvstore.compat.mooncake, so a test can compare the two answer for answer:

    python -m tests.compat.mooncake_scenario real|kvstore MASTER OUT.json

Each step is (label, call); the answers go to OUT.json as [[label, answer], ...], with bytes as
{"bytes": hex}. Only calls that Mooncake answers without crashing are here (it dereferences null
clients and unchecked pointers): tests/compat/test_mooncake_api.py covers those against kvstore.
"""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Callable
from typing import Any

KiB = 1 << 10
ARENA = 64 * KiB


def _plain(value: Any) -> Any:
    if hasattr(value, "ptr") and hasattr(value, "size"):  # a BufferHandle
        return {"handle": bytes(memoryview(value)).hex(), "size": value.size()}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (int, str, float, bool)) or value is None:
        return value
    return type(value).__name__


def steps(mod: Any, master: str) -> list[tuple[str, Callable[[], Any]]]:
    """The calls, in order, on `mod` (the module named mooncake.store)."""
    s = mod.MooncakeDistributedStore()
    arena = (ctypes.c_ubyte * ARENA)()
    p = ctypes.addressof(arena)

    def mem(at: int, n: int) -> bytes:
        return bytes(arena[at : at + n])

    def write(at: int, data: bytes) -> None:
        ctypes.memmove(p + at, data, len(data))

    def put_from_written() -> Any:
        write(0, b"zerocopy")
        return s.put_from("z", p, 8)

    config = mod.ReplicateConfig()
    config.replica_num = 3
    same_node = mod.ReplicateConfig()
    same_node.prefer_alloc_in_same_node = True
    pinned = mod.ReplicateConfig()
    pinned.with_hard_pin = True
    d = mod.MooncakeDistributedStore()
    return [
        ("setup positional", lambda: s.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", master)),
        ("setup dict missing metadata_server", lambda: d.setup({"local_hostname": "127.0.0.1"})),
        (
            "setup dict bad size",
            lambda: d.setup(
                {
                    "local_hostname": "127.0.0.1",
                    "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": "lots",
                    "master_server_addr": master,
                }
            ),
        ),
        (
            "setup dict",
            lambda: d.setup(
                {
                    "local_hostname": "127.0.0.1",
                    "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": 0,
                    "master_server_addr": master,
                }
            ),
        ),
        ("dict-set-up store reads", lambda: (d.put("dict/k", b"via dict"), s.get("dict/k"))),
        ("close dict-set-up store", lambda: d.close()),
        ("health_check", lambda: s.health_check()),
        # bytes API
        ("put", lambda: s.put("a", b"first")),
        ("put existing keeps the first value", lambda: (s.put("a", b"second, longer"), s.get("a"))),
        (
            "put bytearray and memoryview",
            lambda: (s.put("ba", bytearray(b"ba")), s.put("mv", memoryview(b"mv")), s.get("ba"), s.get("mv")),
        ),
        ("put empty value", lambda: (s.put("empty", b""), s.is_exist("empty"))),
        ("put empty key", lambda: s.put("", b"x")),
        ("put prefer_alloc_in_same_node", lambda: (s.put("same", b"x", same_node), s.is_exist("same"))),
        ("put replica_num 3 on one segment", lambda: (s.put("r3", b"abc", config), s.get("r3"))),
        ("put with_hard_pin", lambda: (s.put("hp", b"pin", pinned), s.get("hp"))),
        ("put str value", lambda: s.put("str", "text")),
        ("get missing", lambda: s.get("missing")),
        ("get empty key", lambda: s.get("")),
        ("get_size", lambda: (s.get_size("a"), s.get_size("missing"))),
        ("is_exist", lambda: (s.is_exist("a"), s.is_exist("missing"), s.is_exist(""))),
        ("batch_is_exist", lambda: s.batch_is_exist(["a", "missing", "", "ba"])),
        ("batch_is_exist empty", lambda: s.batch_is_exist([])),
        ("put_batch", lambda: s.put_batch(["b1", "b2"], [b"1", b"22"])),
        ("put_batch duplicate keys: the first wins", lambda: (s.put_batch(["d1", "d1"], [b"1", b"22"]), s.get("d1"))),
        (
            "put_batch over an existing key",
            lambda: (s.put_batch(["b1", "b3"], [b"X", b"333"]), s.get("b1"), s.get("b3")),
        ),
        ("put_batch lengths differ", lambda: s.put_batch(["m1", "m2"], [b"1"])),
        ("put_batch empty", lambda: s.put_batch([], [])),
        ("get_batch", lambda: s.get_batch(["b1", "missing", "b2"])),
        ("get_batch empty", lambda: s.get_batch([])),
        ("put_parts", lambda: (s.put_parts("parts", b"ab", bytearray(b"cd"), memoryview(b"ef")), s.get("parts"))),
        ("put_parts empty", lambda: (s.put_parts("parts0"), s.is_exist("parts0"))),
        ("get_buffer", lambda: (s.get_buffer("parts"), s.get_buffer("missing"))),
        ("batch_get_buffer", lambda: s.batch_get_buffer(["b3", "missing"])),
        # removal (of keys not read: Mooncake's read leases block removal for 10 s)
        ("put keys to remove", lambda: s.put_batch(["x1", "x2", "x3", "x/4", "x/5"], [b"1", b"2", b"3", b"4", b"5"])),
        ("remove", lambda: (s.remove("x1"), s.is_exist("x1"))),
        ("remove missing", lambda: s.remove("missing")),
        ("remove empty key", lambda: s.remove("")),
        ("batch_remove", lambda: s.batch_remove(["x2", "missing", "x3"])),
        ("remove_by_regex", lambda: (s.remove_by_regex("^x/"), s.batch_is_exist(["x/4", "x/5"]))),
        ("remove_by_regex bad pattern", lambda: s.remove_by_regex("(")),
        ("remove a key just read", lambda: s.remove("b2")),
        ("remove a key just read, forced", lambda: (s.remove("b3", True), s.is_exist("b3"))),
        # registered memory
        ("register_buffer", lambda: s.register_buffer(p, ARENA // 2)),
        ("register_buffer again", lambda: s.register_buffer(p, ARENA // 2)),
        ("register_buffer overlapping", lambda: s.register_buffer(p + 100, 100)),
        ("register_buffer size 0", lambda: s.register_buffer(p + ARENA // 2, 0)),
        ("register_buffer second half", lambda: s.register_buffer(p + ARENA // 2, ARENA // 2)),
        ("unregister_buffer not registered", lambda: s.unregister_buffer(p + 8)),
        ("put_from", put_from_written),
        ("put_from existing", lambda: (s.put_from("z", p + 1, 4), s.get("z"))),
        ("put_from size 0", lambda: (s.put_from("z0", p, 0), s.is_exist("z0"))),
        ("put_from inside a buffer", lambda: (s.put_from("zi", p + 2, 6), s.get("zi"))),
        (
            "put_from across two adjacent buffers",
            lambda: (s.put_from("zspan", p + ARENA // 2 - 4, 8), s.get_size("zspan")),
        ),
        ("get_into", lambda: (s.get_into("z", p + 100, 100), mem(100, 8))),
        ("get_into buffer too small", lambda: s.get_into("z", p + 200, 4)),
        ("get_into missing", lambda: s.get_into("missing", p + 200, 100)),
        ("get_into size 0", lambda: s.get_into("z", p + 200, 0)),
        ("get_into empty key", lambda: s.get_into("", p + 200, 100)),
        ("batch_put_from", lambda: s.batch_put_from(["y1", "y2", "z"], [p, p + 8, p], [8, 8, 8])),
        ("batch_put_from lengths differ", lambda: s.batch_put_from(["q1", "q2"], [p], [8, 8])),
        ("batch_put_from duplicate keys", lambda: s.batch_put_from(["q3", "q3"], [p, p + 8], [8, 8])),
        ("batch_put_from replica_num 3", lambda: s.batch_put_from(["q4"], [p], [8], config)),
        (
            "batch_get_into",
            lambda: s.batch_get_into(["y1", "missing", "y2"], [p + 300, p + 400, p + 500], [100, 100, 4]),
        ),
        ("batch_get_into lengths differ", lambda: s.batch_get_into(["y1", "y2"], [p + 300], [100, 100])),
        ("batch_get_into empty", lambda: s.batch_get_into([], [], [])),
        (
            "batch_put_from_multi_buffers",
            lambda: (
                s.batch_put_from_multi_buffers(["mb1", "mb2"], [[p, p + 8], [p + 16]], [[8, 8], [8]]),
                s.get("mb1"),
            ),
        ),
        (
            "batch_put_from_multi_buffers scattered parts",
            lambda: (s.batch_put_from_multi_buffers(["mb3"], [[p + 16, p]], [[4, 8]]), s.get("mb3")),
        ),
        (
            "batch_put_from_multi_buffers part counts differ",
            lambda: s.batch_put_from_multi_buffers(["mb4"], [[p, p + 8]], [[8]]),
        ),
        ("batch_put_from_multi_buffers existing", lambda: s.batch_put_from_multi_buffers(["mb1"], [[p]], [[8]])),
        (
            "batch_put_from_multi_buffers prefer_alloc_in_same_node",
            lambda: s.batch_put_from_multi_buffers(["mb5"], [[p]], [[8]], same_node),
        ),
        (
            "batch_get_into_multi_buffers",
            lambda: (
                s.batch_get_into_multi_buffers(
                    ["mb1", "mb2", "missing"], [[p + 600, p + 700], [p + 800], [p + 900]], [[8, 8], [8], [8]]
                ),
                mem(600, 8),
                mem(700, 8),
                mem(800, 8),
            ),
        ),
        (
            "batch_get_into_multi_buffers uneven parts",
            lambda: (
                s.batch_get_into_multi_buffers(["mb1"], [[p + 1000, p + 1100]], [[4, 12]]),
                mem(1000, 4),
                mem(1100, 12),
            ),
        ),
        (
            "batch_get_into_multi_buffers one run",
            lambda: (s.batch_get_into_multi_buffers(["mb1"], [[p + 1200, p + 1208]], [[8, 8]]), mem(1200, 16)),
        ),
        ("batch_get_into_multi_buffers too small", lambda: s.batch_get_into_multi_buffers(["mb1"], [[p + 600]], [[8]])),
        (
            "batch_get_into_multi_buffers larger than the value",
            lambda: s.batch_get_into_multi_buffers(["mb1"], [[p + 600]], [[32]]),
        ),
        (
            "get_into_ranges",
            lambda: (
                s.get_into_ranges(
                    [p + 2000, p + 2100],
                    [["mb1", "zi"], ["zi", "missing"]],
                    [[[0, 20], [8]], [[4], [0]]],
                    [[[1, 8], [2]], [[0], [0]]],
                    [[[4, 3], [3]], [[6], [4]]],
                ),
                mem(2000, 24),
                mem(2104, 6),
            ),
        ),
        (
            "get_into_ranges source past the end",
            lambda: s.get_into_ranges([p + 2200], [["zi"]], [[[0]]], [[[4]]], [[[4]]]),
        ),
        ("upsert replaces the value", lambda: (s.upsert("up", b"one"), s.upsert("up", b"two!"), s.get("up"))),
        ("upsert_from", lambda: (s.upsert_from("up", p, 8), s.get("up"))),
        (
            "batch_upsert_from",
            lambda: (s.batch_upsert_from(["up", "up2"], [p + 8, p], [8, 8]), s.get("up"), s.get("up2")),
        ),
        ("upsert_batch", lambda: (s.upsert_batch(["up", "up3"], [b"three", b"3"]), s.get("up"), s.get("up3"))),
        ("upsert_parts", lambda: (s.upsert_parts("up", b"fo", b"ur"), s.get("up"))),
        ("unregister_buffer", lambda: (s.unregister_buffer(p), s.unregister_buffer(p + ARENA // 2))),
        ("unregister_buffer again", lambda: s.unregister_buffer(p)),
        ("ReplicateConfig defaults", lambda: str(mod.ReplicateConfig())),
        ("remove_all", lambda: (s.remove_all(force=True), s.batch_is_exist(["a", "z", "mb1"]))),
        ("remove_all again", lambda: s.remove_all()),
        *dropin_steps(mod, s, p, master),
        ("close", lambda: s.close()),
        ("close again", lambda: s.close()),
    ]


def _ttl_conversions(mod: Any) -> list[Any]:
    """What ReplicateConfig.soft_pin_ttl_ms holds after each assignment, or the exception's type."""
    config, out = mod.ReplicateConfig(), [mod.ReplicateConfig().soft_pin_ttl_ms]
    for value in (1000, None, -1, 1 << 64, 1.5, "1000", True, (1 << 64) - 1):
        try:
            config.soft_pin_ttl_ms = value
            out.append(config.soft_pin_ttl_ms)
        except TypeError:
            out.append("TypeError")
    return out


def dropin_steps(mod: Any, s: Any, p: int, master: str) -> list[tuple[str, Callable[[], Any]]]:
    """What Mooncake's own wheel tests rely on: the host:port name, soft-pin TTLs, get_into_ranges
    bounded by each buffer, the bytes API staged through the local buffer. After remove_all, so
    its count stays as it was."""

    def pin(action: Any, ttl_ms: int | None) -> Any:
        config = mod.ReplicateConfig()
        config.soft_pin_action, config.soft_pin_ttl_ms = action, ttl_ms
        return config

    pins = mod.SoftPinAction
    z, m = mod.MooncakeDistributedStore(), mod.MooncakeDistributedStore()
    chunk = 600 * KiB

    def hostname() -> Any:
        host, _, port = s.get_hostname().rpartition(":")
        return host, 12300 <= int(port) <= 14300

    return [
        ("get_hostname adds a port in Mooncake's range", hostname),
        ("ReplicateConfig soft_pin_ttl_ms conversions", lambda: _ttl_conversions(mod)),
        (
            "put with a soft-pin TTL needs ENABLE",
            lambda: (
                s.put("ttl1", b"v", pin(pins.PRESERVE, 1000)),
                s.put("ttl2", b"v", pin(pins.DISABLE, 0)),
                s.put_batch(["ttl3"], [b"v"], pin(pins.DISABLE, 1000)),
                s.put("ttl4", b"v", pin(pins.ENABLE, 1000)),
                s.put("ttl5", b"v", pin(pins.ENABLE, 0)),
                s.batch_is_exist(["ttl1", "ttl2", "ttl3", "ttl4", "ttl5"]),
            ),
        ),
        (
            "upsert refused for a soft-pin TTL keeps the value",
            lambda: (s.upsert("ttl4", b"new", pin(pins.PRESERVE, 1000)), s.get("ttl4")),
        ),
        (
            "register two buffers back to back",
            lambda: (
                s.register_buffer(p, ARENA // 2),
                s.register_buffer(p + ARENA // 2, ARENA // 2),
                s.put("gr", b"0123"),
            ),
        ),
        (
            "get_into_ranges destination into the next buffer",
            lambda: s.get_into_ranges([p + ARENA // 2 - 2], [["gr"]], [[[0]]], [[[0]]], [[[4]]]),
        ),
        ("unregister the two buffers", lambda: (s.unregister_buffer(p), s.unregister_buffer(p + ARENA // 2))),
        ("setup without a local buffer", lambda: z.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master)),
        (
            "no local buffer: the bytes API fails",
            lambda: (
                z.put("lb0", b"v"),
                z.put_batch(["lb0b"], [b"v"]),
                z.put_parts("lb0p", b"a", b"b"),
                z.upsert("gr", b"x"),
                z.get("gr"),
                z.get_batch(["gr"]),
                z.get_buffer("gr") is None,
                z.get_size("gr"),
                s.batch_is_exist(["lb0", "lb0b", "lb0p", "gr"]),
            ),
        ),
        (
            "no local buffer: registered memory works",
            lambda: (z.register_buffer(p, 64), z.get_into("gr", p, 64), z.put_from("lb0z", p, 4), s.get("lb0z")),
        ),
        ("close the store without a local buffer", lambda: z.close()),
        (
            "setup with a 1 MiB local buffer",
            lambda: m.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", master),
        ),
        (
            "1 MiB local buffer: puts",
            lambda: (
                m.put("lb1", b"x" * (1 << 20)),
                m.put("lb2", b"x" * (2 << 20)),
                m.put_batch(["lbb1", "lbb2"], [b"y" * chunk] * 2),
                m.put_parts("lbp", b"a" * chunk, b"b" * chunk),
                s.batch_is_exist(["lb1", "lb2", "lbb1", "lbb2", "lbp"]),
            ),
        ),
        (
            "1 MiB local buffer: reads take room in order",
            lambda: (
                s.put_batch(["lbh1", "lbh2"], [b"q" * chunk] * 2),
                [len(v) for v in m.get_batch(["lbh1", "lbh2"])],
                [b if b is None else b.size() for b in m.batch_get_buffer(["lbh1", "lbh2"])],
                len(m.get("lbh1")),
            ),
        ),
        ("close the store with a 1 MiB local buffer", lambda: m.close()),
    ]


def run(mod: Any, master: str) -> list[list[Any]]:
    out = []
    for label, call in steps(mod, master):
        try:
            answer = _plain(call())
        except Exception as exc:  # noqa: BLE001 - the answer is the exception's type
            answer = {"raises": type(exc).__name__}
        out.append([label, answer])
    return out


def main(argv: list[str]) -> int:
    which, master, path = argv
    if which == "real":
        import mooncake.store as mod
    else:
        import kvstore.compat.mooncake as mod
    results = run(mod, master)
    with open(path, "w") as fh:
        json.dump(results, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
