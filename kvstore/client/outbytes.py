"""Fresh `bytes` objects a read can fill in place, so get() returns a value with one copy.

bytes are immutable to Python code, but CPython builds every one by allocating it uninitialised
(PyBytes_FromStringAndSize(NULL, n)) and filling it before anyone else sees it; this does the
same through ctypes. The object must not be hashed, compared or shared until filled, which holds
because new_bytes' caller keeps it to itself until the read is done (and drops it on failure).
"""

from __future__ import annotations

import ctypes

_from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_from_size.restype = ctypes.py_object
_from_size.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_as_string = ctypes.pythonapi.PyBytes_AsString
_as_string.restype = ctypes.c_void_p
_as_string.argtypes = (ctypes.py_object,)


def new_bytes(size: int) -> tuple[bytes, memoryview]:
    """An uninitialised bytes object of `size` bytes and a writable view of its contents (b"" and
    an empty view for 0: the empty bytes object is shared, never written)."""
    if size <= 0:
        return b"", memoryview(bytearray())
    value: bytes = _from_size(None, size)
    buffer = (ctypes.c_char * size).from_address(_as_string(value))
    buffer.owner = value  # type: ignore[attr-defined]  # the view keeps the object it writes into alive
    return value, memoryview(buffer).cast("B")
