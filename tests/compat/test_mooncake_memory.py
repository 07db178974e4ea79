"""The registry of caller memory behind register_buffer and the zero-copy calls (no server)."""

from __future__ import annotations

import ctypes

from kvstore.compat.mooncake.memory import RegisteredMemory


def test_ranges_must_be_registered_and_views_alias_the_memory():
    buf = (ctypes.c_ubyte * 300)()
    p = ctypes.addressof(buf)
    mem = RegisteredMemory()
    assert mem.register(p, 100) and mem.register(p + 100, 100)  # back to back
    assert not mem.register(p + 50, 10) and not mem.register(p - 10, 20)  # overlaps
    assert not mem.register(0, 10) and not mem.register(p + 250, 0) and not mem.register(True, 10)
    assert mem.covers(p, 100) and mem.covers(p + 90, 20) and mem.covers(p, 200)
    assert not mem.covers(p + 190, 20) and not mem.covers(p - 1, 2) and not mem.covers(p, 0)
    view = mem.view(p + 10, 5)
    assert view is not None
    view[:] = b"abcde"
    assert bytes(buf[10:15]) == b"abcde"
    span = mem.view(p + 98, 4)  # across the two buffers
    assert span is not None
    span[:] = b"wxyz"
    assert bytes(buf[98:102]) == b"wxyz"
    assert mem.view(p + 199, 2) is None
    assert mem.unregister(p + 100) and not mem.unregister(p + 100) and not mem.unregister(p + 1)
    assert not mem.covers(p, 101) and mem.view(p + 100, 1) is None
    assert [r.end for r in mem.regions()] == [p + 100]


def test_view_within_stays_inside_the_region_that_holds_the_buffer():
    buf = (ctypes.c_ubyte * 64)()
    p = ctypes.addressof(buf)
    mem = RegisteredMemory()
    assert mem.register(p, 32) and mem.register(p + 32, 32)  # back to back
    assert mem.view_within(p + 28, 2, 2) is not None  # up to the first region's end
    assert mem.view_within(p + 28, 2, 3) is None  # one byte into the second: not this buffer's
    assert mem.view_within(p, 30, 4) is None and mem.covers(p + 30, 4)  # though both are registered
    assert mem.view_within(p + 32, 28, 4) is not None and mem.view_within(p + 32, 29, 4) is None
    assert mem.view_within(p, -1, 4) is None and mem.view_within(p, 0, 0) is None
    assert mem.view_within(p + 64, 0, 1) is None and mem.view_within(0, 0, 1) is None
    view = mem.view_within(p + 4, 4, 2)
    assert view is not None
    view[:] = b"ok"
    assert bytes(buf[8:10]) == b"ok"
