"""Argument checks shared by the API's calls: wrong types raise TypeError, as pybind11's
conversions do in Mooncake's binding; values that convert but make no sense become error codes
in the calls themselves."""

from __future__ import annotations

from typing import Any

from kvstore.compat.mooncake.replicate import ReplicateConfig


def byte_view(value: Any) -> memoryview:
    """A flat byte view of a buffer-protocol object, without a copy."""
    if isinstance(value, str):
        raise TypeError("value must be a bytes-like object (bytes, bytearray, memoryview, array), not str")
    view = memoryview(value)
    if not view.contiguous:
        raise TypeError("value must be a contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def key(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"key must be str, not {type(value).__name__}")
    return value


def keys(values: Any) -> list[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError("keys must be a list of str")
    return [key(k) for k in values]


def ints(values: Any, what: str) -> list[int]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a list of int")
    out = list(values)
    for v in out:
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{what} must be a list of int, not {type(v).__name__}")
    return out


def config(value: Any) -> ReplicateConfig | None:
    if value is not None and not isinstance(value, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not {type(value).__name__}")
    return value
