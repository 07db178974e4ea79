"""LocalMeta: the metadata service's calls made in this process, on a store's handlers, as one
caller (a Principal). It satisfies the same MetaApi as the remote clients, and goes through the
same path as a call off the wire (the message in, the role check, the tenant's view, the message
out), so what it answers is what a client of the service would be answered."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kvstore.server.auth import OPERATOR, Principal
from kvstore.server.handlers import MetaHandlers
from kvstore.wire import codec
from kvstore.wire.call import Call

R = TypeVar("R")


class LocalMeta:
    def __init__(self, handlers: MetaHandlers, who: Principal = OPERATOR) -> None:
        self.handlers = handlers
        self.who = who

    def call(self, req: Call[R], timeout_s: float | None = None, retry_s: float = 0.0) -> R:
        response = self.handlers.handler(req.rpc)(codec.request_to_pb(req), self.who)
        reply: R = req.reply.from_pb(response, req)
        return reply

    def begin(self, req: Call[R], timeout_s: float | None = None) -> Callable[[], R]:
        reply = self.call(req, timeout_s)
        return lambda: reply
