"""Caller memory as flat byte views (kvstore/client/buffers.py): a batch of bytes or bytearrays is
viewed in one pass, and anything else is left to byte_view, which checks it."""

from __future__ import annotations

import array

import numpy as np
import pytest

from kvstore.client.buffers import byte_view, plain_views
from kvstore.errors import InvalidArgument


def test_a_batch_of_bytes_and_bytearrays_is_viewed_in_place():
    mutable = bytearray(b"de")
    views = plain_views([b"abc", mutable], writable=False)
    assert views is not None and [v.tobytes() for v in views] == [b"abc", b"de"]
    mutable[0] = ord("x")
    assert views[1].tobytes() == b"xe"  # a view, not a copy
    assert all(v.format == "B" and v.ndim == 1 for v in views)


def test_a_batch_written_into_takes_bytearrays_only():
    assert plain_views([bytearray(4)], writable=True) is not None
    assert plain_views([bytearray(4), b"ro"], writable=True) is None  # bytes are read-only
    with pytest.raises(InvalidArgument, match="read-only"):
        byte_view(b"ro", writable=True)


def test_flat_uint8_arrays_and_memoryviews_are_plain_too():
    arrays = [np.arange(8, dtype=np.uint8), memoryview(bytearray(3))]
    views = plain_views(arrays, writable=True)
    assert views is not None and [v.nbytes for v in views] == [8, 3]
    assert plain_views([np.arange(8, dtype=np.uint8)[::2]], writable=False) is None  # strided
    assert plain_views([np.zeros(2, dtype=np.uint8), b"x"], writable=True) is None  # bytes: read-only


@pytest.mark.parametrize(
    "other", [memoryview(b"abcd").cast("B", (2, 2)), array.array("i", [1, 2]), np.zeros(2, dtype=np.float32), "text"]
)
def test_anything_else_takes_the_general_path(other):
    assert plain_views([b"x", other], writable=False) is None
    if isinstance(other, str):
        with pytest.raises(InvalidArgument, match="not a buffer"):
            byte_view(other, writable=False)
    else:
        assert byte_view(other, writable=False).nbytes == memoryview(other).nbytes
