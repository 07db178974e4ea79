"""Caller memory as flat byte views: numpy arrays, torch CPU tensors, bytes-likes. (Tensors in
device memory are staged through host memory by kvstore.client.staging before they get here.)

Nothing here imports torch: a tensor is recognised by its type's module and viewed through its own
methods, so the client costs nothing extra for callers that never pass one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstore.errors import InvalidArgument

_PLAIN = {False: frozenset({bytes, bytearray}), True: frozenset({bytearray})}  # by `writable`


def _from_tensor(t: Any) -> memoryview:
    if t.device.type != "cpu":
        raise InvalidArgument(
            f"tensor on {t.device}: a byte view needs host memory; KVClient stages device "
            "tensors itself (kvstore.client.staging), other callers copy to a CPU tensor first"
        )
    if not t.is_contiguous():
        raise InvalidArgument("tensor is not contiguous: call .contiguous() first")
    import torch

    # A uint8 view shares memory and works for dtypes numpy lacks (bfloat16, float8).
    return memoryview(t.view(torch.uint8).reshape(-1).numpy())


def byte_view(obj: Any, writable: bool) -> memoryview:
    """A 1-D unsigned-byte memoryview aliasing `obj`'s memory (no copy)."""
    kind = type(obj)
    if kind is bytearray or (kind is bytes and not writable):  # the common case, checked for nothing
        return memoryview(obj)
    if kind.__module__.startswith("torch"):
        view = _from_tensor(obj)
    else:
        try:
            view = memoryview(obj)
        except TypeError as exc:
            raise InvalidArgument(
                f"{type(obj).__name__} is not a buffer: pass bytes, bytearray, "
                "memoryview, a numpy array or a CPU tensor"
            ) from exc
    if not view.contiguous:
        raise InvalidArgument("buffer is not contiguous: pass a contiguous array")
    if writable and view.readonly:
        raise InvalidArgument(f"{type(obj).__name__} is read-only: get_into needs a writable buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def plain_views(objs: Sequence[Any], writable: bool) -> list[memoryview] | None:
    """byte_view of each object, without its per-object checks, where none is a tensor and each
    is already flat unsigned bytes, C-contiguous (writable, if `writable`): bytes, bytearray, a
    1-D uint8 numpy array, such a memoryview; a batch's usual case. None otherwise: view each with
    byte_view."""
    kinds = set(map(type, objs))
    if not kinds <= _PLAIN[writable]:
        if any(kind.__module__.startswith("torch") for kind in kinds):
            return None
        try:
            views = [memoryview(o) for o in objs]
        except TypeError:
            return None
        for v in views:
            if v.format != "B" or v.ndim != 1 or not v.c_contiguous or (writable and v.readonly):
                return None
        return views
    return [memoryview(o) for o in objs]
