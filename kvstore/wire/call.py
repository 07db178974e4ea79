"""A metadata call as a value: the base of every call in kvstore.wire.calls, what each says about
itself (who may make it, whether it may be repeated, how a sharded store makes it), and how its
reply value travels to and from its response message."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Generic, TypeVar

from google.protobuf.message import Message

R = TypeVar("R")


class Role(Enum):
    DATA = "data"  # a tenant's calls on its own keys (the admin's too)
    DAEMON = "daemon"  # the storage daemons' (the admin's too)
    ADMIN = "admin"  # the admin's only
    ANYONE = "anyone"  # where the service stands: any caller, lease or not


class Fan(Enum):
    """How a sharded store makes the call (kvstore/metaclient/sharded.py)."""

    BASE = "base"  # on the service the client was given
    SPLIT = "split"  # each shard its own keys (and the `keyed` fields aligned with them), merged back
    EVERY = "every"  # on every shard, the answers merged
    PREFIX = "prefix"  # MatchPrefix: one shard when the chain shares one, else Exists on each
    TENANTS = "tenants"  # on shard 0 first, then on the others with what it answered


@dataclass(frozen=True)
class Call(Generic[R]):
    rpc: ClassVar[str]  # the RPC's name (the class's)
    method_id: ClassVar[int]  # the fast lane's, pinned: a new call takes a new id
    role: ClassVar[Role]
    reply: ClassVar[Reply[Any]]
    repeatable: ClassVar[bool] = True  # safe to send again when its answer was lost
    fan: ClassVar[Fan] = Fan.BASE
    keyed: ClassVar[tuple[str, ...]] = ()  # fields with one item per key (SPLIT picks each shard's)
    merge: ClassVar[str] = "concat"  # how SPLIT and EVERY put the shards' answers together
    leases: ClassVar[bool] = False  # its `released` read leases go to the shards that granted them
    hints: ClassVar[bool] = False  # its `touched` keys go to the shards that own them

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.rpc = cls.__name__

    def is_repeatable(self) -> bool:
        return self.repeatable

    def value(self, name: str, default: Any = None) -> Any:
        """The field `name` (`value("keys")` of a keyed call); `default` for a call without it."""
        return getattr(self, name, default)

    # -- TENANTS: the same call on every shard ------------------------------------------------

    def first(self, shards: int) -> Call[R]:
        """The call shard 0 gets."""
        return self

    def then(self, first: R) -> Call[R]:
        """The call the other shards get, given shard 0's answer."""
        return self

    def again(self) -> Call[R] | None:
        """The call to make instead on a shard that refused `then()` (AlreadyExists, KeyNotFound:
        an earlier call stopped part way); None: that refusal stands."""
        return None

    def joined(self, first: R) -> R:
        """The store's answer, given shard 0's."""
        return first


def snake(name: str) -> str:
    """PutStart -> put_start: the handler method of the RPC `name`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


# -- replies ------------------------------------------------------------------------------------


class Reply(Generic[R]):
    """A call's reply value to (`to_pb`, the service) and from (`from_pb`, the client) its message."""

    def to_pb(self, value: R, response: type[Message]) -> Message:
        raise NotImplementedError

    def from_pb(self, msg: Any, call: Any) -> R:
        raise NotImplementedError


@dataclass(frozen=True)
class Whole(Reply[R]):
    """The whole message is the value (its converters are in kvstore.wire.convert)."""

    to: Callable[[R], Message]
    back: Callable[[Any], R]

    def to_pb(self, value: R, response: type[Message]) -> Message:
        return self.to(value)

    def from_pb(self, msg: Any, call: Any) -> R:
        return self.back(msg)


@dataclass(frozen=True)
class One(Reply[R]):
    """One field of the message is the value: `back(field)`, or `back(field, call)` with `of_call`
    (a reply that needs the request, say its keys)."""

    field: str
    back: Callable[..., R]
    to: Callable[[R], Any] | None = None
    of_call: bool = False
    # encode(value, field number): the field's encoding, parsed into the message in one call (for
    # a long repeated field whose messages cost more to build one at a time)
    encode: Callable[[R, int], bytes] | None = None

    def to_pb(self, value: R, response: type[Message]) -> Message:
        if self.encode is not None:
            return response.FromString(self.encode(value, response.DESCRIPTOR.fields_by_name[self.field].number))
        return response(**{self.field: self.to(value) if self.to is not None else value})

    def from_pb(self, msg: Any, call: Any) -> R:
        value = getattr(msg, self.field)
        return self.back(value, call) if self.of_call else self.back(value)


@dataclass(frozen=True)
class Fields(Reply[tuple[Any, ...]]):
    """A few scalar fields of the message, as a tuple in this order."""

    names: tuple[str, ...]

    def to_pb(self, value: tuple[Any, ...], response: type[Message]) -> Message:
        return response(**dict(zip(self.names, value, strict=True)))

    def from_pb(self, msg: Any, call: Any) -> tuple[Any, ...]:
        return tuple(getattr(msg, n) for n in self.names)


class Nothing(Reply[None]):
    """An empty response."""

    def to_pb(self, value: None, response: type[Message]) -> Message:
        return response()

    def from_pb(self, msg: Any, call: Any) -> None:
        return None


NOTHING = Nothing()
