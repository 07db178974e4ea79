"""The metadata service as a running server: gRPC (MetaServicer over MetaHandlers), its health
service, the fast lane, the upkeep ticker, and (when configured) the admin face and KV events."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvstore import tokens
from kvstore.admin.http import Response
from kvstore.clock import Clock, SystemClock
from kvstore.config import MetaConfig
from kvstore.errors import KVStoreError, PermissionDenied, Unavailable, to_grpc_status
from kvstore.grant import GrantSigner
from kvstore.logs import RateLimited
from kvstore.meta.ha import Replicated, Single, Stores
from kvstore.meta.journal import Journal
from kvstore.meta.shardmap import directory
from kvstore.meta.store import MetaStore
from kvstore.server.auth import Authenticator
from kvstore.server.faces import Faces
from kvstore.server.fastlane import FastLaneServer
from kvstore.server.handlers import MetaHandlers
from kvstore.shards import ShardSpec
from kvstore.tls import TlsFiles, grpc_server_credentials, server_context
from kvstore.wire import convert, frames

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
HISTORY_INTERVAL_S = 2.0  # how often the service samples its statistics (dashboard rates, events)
SERVICE_NAME = "kvstore.v1.MetaService"
MAX_MESSAGE_BYTES = 64 << 20
_bad_input = RateLimited(log)


class _Undecodable(NamedTuple):
    error: str


def _decoder(message_type: type[Message]) -> Callable[[bytes], Any]:
    """A request deserializer that never raises (gRPC would log a traceback per bad message):
    an undecodable request reaches the handler as _Undecodable, and is refused there."""

    def decode(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception as exc:  # noqa: BLE001 - whatever protobuf raises for bad bytes
            return _Undecodable(f"{type(exc).__name__}: {exc}")

    return decode


def _bearer(context: grpc.ServicerContext) -> str:
    for key, value in context.invocation_metadata():
        if key == "authorization" and isinstance(value, str):
            return value.removeprefix("Bearer ").strip()
    return ""


def grpc_handler(handlers: MetaHandlers, auth: Authenticator) -> grpc.GenericRpcHandler:
    """gRPC's face of MetaHandlers: each RPC of MetaService calls the handler of the same name as
    the caller its `authorization: Bearer TOKEN` metadata names, and a KVStoreError becomes a
    gRPC status plus the full ErrorDetail in trailing metadata."""

    def rpc(name: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        handler = handlers.handler(name)

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                _bad_input.warning(
                    name, "refused an undecodable %s request from %s: %s", name, context.peer(), request.error
                )
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode {name}: {request.error}")
            try:
                return handler(request, auth.principal(_bearer(context)))
            except KVStoreError as exc:
                context.set_trailing_metadata(
                    ((convert.ERROR_DETAIL_KEY, convert.error_to_pb(exc).SerializeToString()),)
                )
                context.abort(to_grpc_status(exc), str(exc))
            except Exception as exc:
                log.exception("internal error in %s", name)
                context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")

        return call

    methods = {
        m.name: grpc.unary_unary_rpc_method_handler(
            rpc(m.name), request_deserializer=_decoder(m.request), response_serializer=m.response.SerializeToString
        )
        for m in frames.METHODS.values()
    }
    return grpc.method_handlers_generic_handler(SERVICE_NAME, methods)


def _why_no_store(stores: Stores) -> Callable[[], KVStoreError]:
    """What a tenant token's call hears where no store (so no tenant registry) answers: a
    standby's NotLeader naming the leader, or a leader's Unavailable while it loads."""

    def why() -> KVStoreError:
        try:
            stores.for_reads()
        except KVStoreError as exc:
            return exc
        return Unavailable("this metadata service is loading its tenants: retry")

    return why


class MetaServer:
    """A running metadata service: gRPC server, health service and the upkeep ticker."""

    def __init__(
        self, config: MetaConfig, signer: GrantSigner, clock: Clock | None = None, admin_token: str | None = None
    ) -> None:
        """In memory (one MetaStore), or on Redis (config.redis_url: leader or standby, see ha.py);
        Unavailable if Redis does not answer, InvalidArgument if it holds another's records.
        `admin_token`: the operator's (default: $KVSTORE_TOKEN, else the token file, made if
        there is none; `token_source` says which)."""
        self.config = config
        self.token_source = ""
        if admin_token is None and config.auth:
            admin_token, self.token_source = tokens.admin_token()
        self._stop = threading.Event()
        clock = clock or SystemClock()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="meta-rpc"),
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        tls = TlsFiles(config.tls_cert, config.tls_key, config.tls_ca)
        if tls.serving:
            self.port = self._server.add_secure_port(f"{config.host}:{config.port}", grpc_server_credentials(tls))
        else:
            self.port = self._server.add_insecure_port(f"{config.host}:{config.port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {config.host}:{config.port} (in use?)")
        self.stores: Stores
        if config.redis_url:

            def make(journal: Journal, grant_ceiling: Callable[[], float]) -> MetaStore:
                return MetaStore(config, signer, clock, journal=journal, grant_ceiling=grant_ceiling)

            self.stores = Replicated(config, signer, config.advertise or self.address, clock, make)
        else:
            self.stores = Single(MetaStore(config, signer, clock))
        faces = Faces(config, self.stores, clock)
        self.metrics, self.history = faces.metrics, faces.history
        redis = self.stores.redis if isinstance(self.stores, Replicated) else None
        self.shards = directory(config, config.advertise or self.address, redis)
        self.handlers = handlers = MetaHandlers(self.stores, self.metrics, ShardSpec.parse(config.shard), self.shards)
        stores = self.stores
        self.auth = Authenticator(
            config.auth,
            admin_token or "",
            signer.daemon_token,
            lambda: s.tenants if (s := stores.current()) else None,
            clock,
            _why_no_store(stores),
        )
        self._server.add_generic_rpc_handlers((grpc_handler(handlers, self.auth),))
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self._ticker = threading.Thread(target=self._tick_loop, name="meta-tick", daemon=True)
        self.admin = faces.admin_face(self._operator, self._invariants)
        self.events = faces.events(self.admin)
        self._fast_lane: FastLaneServer | None = None
        if config.fast_lane:
            self._fast_lane = FastLaneServer(
                handlers,
                self.auth,
                config.host,
                config.fast_lane_port,
                config.connection_limits,
                server_context(tls) if tls.serving else None,
            )
            handlers.fast_lane_port = self._fast_lane.port

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def _operator(self, token: str) -> None:
        """The admin face's guard: returns if `token` is the operator's (an admin's, as gRPC
        would have it); Unauthenticated or PermissionDenied if not."""
        if not self.auth.principal(token).admin:
            raise PermissionDenied("a tenant's or a daemon's token is not the operator's")

    def _invariants(self, query: dict[str, list[str]], body: bytes) -> Response:
        """check_invariants() of the store this service answers from (for tests and operators)."""
        store = self.stores.current()
        if store is None:
            return Response.json({"ok": None, "why": "no store: this service is a standby"})
        try:
            store.check_invariants()
        except AssertionError as exc:
            return Response.json({"ok": False, "why": str(exc)}, 500)
        return Response.json({"ok": True})

    @property
    def store(self) -> MetaStore | None:
        """The store this service answers from now (None on a standby)."""
        return self.stores.current()

    def start(self) -> MetaServer:
        if self.events is not None:
            self.events.start(self.stores.current())  # before serving: no change goes unreported
        self._server.start()
        if isinstance(self.stores, Replicated):
            self.stores.start()
        if self._fast_lane is not None:
            self._fast_lane.start()
        if self.admin is not None:
            self.admin.start()
            log.info("admin (HTTP) on %s", self.admin.address)
        self._ticker.start()
        self.history.start(HISTORY_INTERVAL_S)
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("metadata service listening on %s", self.address)
        return self

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.config.tick_interval_s):
            store = self.stores.current()
            try:
                if self.events is not None:
                    self.events.follow(store)  # a takeover's new store, or none once deposed
                if store is not None:
                    store.tick()
            except KVStoreError as exc:  # the journal refused: logged once where it failed
                log.debug("metadata upkeep: %s", exc)
            except Exception:
                log.exception("metadata upkeep failed")

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        self.history.stop()
        self._health.enter_graceful_shutdown()
        self.stores.stop()
        if self._fast_lane is not None:
            self._fast_lane.stop()
        if self.admin is not None:
            self.admin.stop()
        self._server.stop(grace).wait()
        if self._ticker.is_alive():
            self._ticker.join(timeout=5)
        if self.events is not None:
            self.events.stop()  # after the ticker: it may be following a new store

    def wait(self) -> None:
        self._server.wait_for_termination()
