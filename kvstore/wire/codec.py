"""How a metadata call's request travels: a request value (kvstore.wire.calls) to and from its
protobuf request message by field name (replies travel by their class's `reply`, kvstore.wire.call).

A request field goes to the message field of the same name unless its `wire(...)` metadata names
another or converts it (seconds sent as milliseconds, a SegmentInfo as a Segment message). Each
call class's plan is worked out once, on its first use: encoding and decoding then cost one
attribute read per field (the fast lane's budget is tens of microseconds a call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kvstore.errors import InvalidArgument
from kvstore.v1 import meta_pb2 as pb
from kvstore.wire.call import Call

R = TypeVar("R")
_WIRE = "kvstore.wire"  # the dataclass field metadata key of `wire(...)`


def wire(name: str = "", to: Callable[[Any], Any] | None = None, back: Callable[[Any], Any] | None = None) -> Any:
    """A request field's wire form: the message field `name` (default: the field's own name),
    filled with `to(value)` and read back with `back(field)`."""
    return {_WIRE: (name, to, back)}


@dataclass(frozen=True)
class _Field:
    name: str  # the value's
    wire: str  # the message's
    to: Callable[[Any], Any] | None
    back: Callable[[Any], Any] | None
    repeated: bool
    message: bool  # a singular message field: required


@dataclass(frozen=True)
class _Plan:
    request: type[Message]
    response: type[Message]
    fields: tuple[_Field, ...]


_plans: dict[type[Any], _Plan] = {}


def _plan(cls: type[Call[Any]]) -> _Plan:
    plan = _plans.get(cls)
    if plan is not None:
        return plan
    request: type[Message] = getattr(pb, f"{cls.rpc}Request")
    found = []
    for f in dataclasses.fields(cls):
        name, to, back = f.metadata.get(_WIRE, ("", None, None))
        descriptor = request.DESCRIPTOR.fields_by_name.get(name or f.name)
        if descriptor is None:
            raise TypeError(f"{cls.rpc}: {request.__name__} has no field {name or f.name!r}")
        found.append(
            _Field(
                f.name,
                descriptor.name,
                to,
                back,
                descriptor.is_repeated,
                descriptor.type == FieldDescriptor.TYPE_MESSAGE and not descriptor.is_repeated,
            )
        )
    plan = _plans[cls] = _Plan(request, getattr(pb, f"{cls.rpc}Response"), tuple(found))
    return plan


def request_to_pb(call: Call[Any]) -> Message:
    plan = _plan(type(call))
    fields = {}
    values = call.__dict__
    for f in plan.fields:
        value = values[f.name]
        if value:  # a field at its default (empty, zero, "") is left out: the same message, built faster
            fields[f.wire] = f.to(value) if f.to is not None else value
    return plan.request(**fields)


def request_from_pb(cls: type[Call[R]], msg: Any) -> Call[R]:
    """The call `msg` (the service's side); InvalidArgument for a message field left out."""
    values = {}
    for f in _plan(cls).fields:
        if f.message and not msg.HasField(f.wire):
            raise InvalidArgument(f"{cls.rpc} needs a {f.wire}")
        value = getattr(msg, f.wire)
        if f.back is not None:
            value = f.back(value)
        elif f.repeated:
            value = list(value)
        values[f.name] = value
    # Every field is set, so the frozen dataclass's __init__ (a setattr per field) can be skipped:
    # this runs on every call the service decodes.
    call: Call[R] = object.__new__(cls)
    call.__dict__.update(values)
    return call


def response_type(cls: type[Call[Any]]) -> type[Message]:
    return _plan(cls).response


def each(convert: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    """A converter of one item, applied to every item of a repeated field."""
    return lambda items: [convert(i) for i in items]


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def seconds(ms: int) -> float:
    return ms / 1000
