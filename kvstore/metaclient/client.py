"""MetaClient: the metadata service's calls, `meta.call(PutStart(keys, sizes))`.

The one way any process talks to the service: the client SDK, the storage daemon and its tier
mover all use it. Calls and their replies are the typed values of kvstore.wire.calls (replies of
kvstore.results and kvstore.types); protobuf stays in kvstore.wire. Thread safe.

`address` names one service ("host:port"), several ("h1:p1,h2:p2": a leader and its standbys),
or a Redis URL ("redis://host:port/db?cluster=NAME") where the leader is looked up. A call a
standby refuses (NotLeader) goes to the leader it names; a call that finds a service down goes
to the next one. Calls safe to repeat are retried while no service answers, until `retry_s`;
a PutStart whose answer was lost is never repeated (the writer revokes it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kvstore import tokens
from kvstore.errors import NotLeader, Unavailable, WrongShard
from kvstore.metaclient.channel import MetaChannel
from kvstore.metaclient.targets import Targets
from kvstore.tls import TlsFiles
from kvstore.wire import codec
from kvstore.wire.call import Call

R = TypeVar("R")
_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
_MAX_HOPS = 4  # NotLeader redirections followed for one call


class MetaClient:
    def __init__(
        self,
        address: str,
        timeout_s: float = 10.0,
        fast_lane: bool = True,
        token: str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        """`token`: the bearer token calls carry (None: $KVSTORE_TOKEN, else the token file);
        `tls`: speak TLS to the service, checking it against `tls.ca`."""
        self.address = address
        self.timeout_s = timeout_s
        self._fast_lane = fast_lane
        self._token = tokens.client_token() if token is None else token
        if self._token:
            tokens.check_sendable(self._token)
        self._tls = tls
        self._targets = Targets(address)
        self._channels: dict[str, MetaChannel] = {}
        self._lock = threading.Lock()

    def like(self, address: str, shard: int) -> MetaClient:
        """A client of shard `shard` (at `address`, or where this client's Redis names its leader)
        with this client's token, TLS and timeouts."""
        target = self._targets.for_shard(shard) or address
        return MetaClient(target, self.timeout_s, self._fast_lane, self._token, self._tls)

    @property
    def current(self) -> str:
        """The service address calls go to now."""
        return self._targets.current

    @property
    def fast_lane_port(self) -> int:
        """The fast lane's port in use, 0 while calls go over gRPC."""
        return self._channel(self._targets.current).fast_lane_port

    def _channel(self, address: str) -> MetaChannel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = MetaChannel(
                    address, self.timeout_s, self._fast_lane, self._token, self._tls
                )
            return channel

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> MetaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, name: str, request: Any, timeout_s: float | None = None, retry_s: float = 0.0, repeatable: bool = True
    ) -> Any:
        """One call, followed to the leader; while no service answers, again with backoff for up
        to `retry_s` (only if `repeatable`: a call whose outcome is unknown is not sent twice).
        Its hops share one timeout: a standby that names an unreachable leader, then the leader's
        silence, take `timeout_s` together, not each (plus `retry_s` of asking again)."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        give_up, deadline = now + retry_s, now + budget + retry_s
        attempt = hops = 0
        failure: Unavailable | None = None
        while True:
            address = self._targets.current
            left = deadline - time.monotonic()
            if left <= 0 and failure is not None:
                raise failure
            try:
                return self._channel(address).call(name, request, timeout_s if left >= budget else max(left, 1e-3))
            except NotLeader as exc:  # not executed there: always safe to send to the leader
                hops += 1
                failure = exc
                if self._targets.follow(exc.leader, address) and hops <= _MAX_HOPS:
                    continue
            except WrongShard:  # a stale shard map, not an outage: only the sharded client can mend it
                raise
            except Unavailable as exc:
                if not repeatable:
                    raise
                failure = exc
                if self._targets.next_after(address) and attempt < len(self._targets):
                    attempt += 1
                    continue
            pause = _BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)]
            if time.monotonic() + pause >= give_up:
                raise failure
            time.sleep(pause)  # no service answers (an election, or all down): wait, then ask again
            attempt += 1

    def _begin(
        self, name: str, request: Any, timeout_s: float | None = None, repeatable: bool = True
    ) -> Callable[[], Any]:
        """Send one call now; what is returned waits for its answer. A call that meets a standby
        or no service is finished the way `_call` makes it, synchronously."""

        def again() -> Any:
            return self._call(name, request, timeout_s, repeatable=repeatable)

        address = ""
        try:
            address = self._targets.current
            finish = self._channel(address).begin(name, request, timeout_s)
        except Unavailable:
            if not repeatable:
                raise
            return again

        def done() -> Any:
            try:
                return finish()
            except NotLeader as exc:  # not executed there
                self._targets.follow(exc.leader, address)
                return again()
            except WrongShard:
                raise
            except Unavailable:  # as `_call` does: again only where there is another service to ask
                if not repeatable or not self._targets.next_after(address):
                    raise
                return again()

        return done

    # -- the calls (kvstore.wire.calls) ------------------------------------------------------------

    def call(self, req: Call[R], timeout_s: float | None = None, retry_s: float = 0.0) -> R:
        """Make the call `req` and return its reply; again with backoff for up to `retry_s` while
        no service answers, if the call is safe to repeat."""
        response = self._call(req.rpc, codec.request_to_pb(req), timeout_s, retry_s, req.is_repeatable())
        reply: R = req.reply.from_pb(response, req)
        return reply

    def begin(self, req: Call[R], timeout_s: float | None = None) -> Callable[[], R]:
        """Send the call `req` now; what is returned waits for its reply."""
        finish = self._begin(req.rpc, codec.request_to_pb(req), timeout_s, req.is_repeatable())

        def done() -> R:
            reply: R = req.reply.from_pb(finish(), req)
            return reply

        return done
