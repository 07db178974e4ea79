"""The gRPC face of the metadata service: translates wire <-> MetaStore, nothing more."""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvstore import __version__, wire
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument, KVStoreError, to_grpc_status
from kvstore.meta.store import MetaStore
from kvstore.v1 import meta_pb2 as pb
from kvstore.v1 import meta_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "kvstore.v1.MetaService"
MAX_MESSAGE_BYTES = 64 << 20


def _translating(method: Callable) -> Callable:
    """Run a servicer method, turning domain errors into gRPC statuses."""
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except KVStoreError as exc:
            context.abort(to_grpc_status(exc), str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug must not take the server down
            log.exception("internal error in %s", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error: {exc}")
    wrapper.__name__ = method.__name__
    return wrapper


def _referenced_segments(store: MetaStore, grants_lists) -> list[pb.Segment]:
    ids = [g.segment_id for grants in grants_lists for g in grants]
    return [wire.segment_to_pb(s) for s in store.segments(ids)]


class MetaServicer(pb_grpc.MetaServiceServicer):
    def __init__(self, store: MetaStore) -> None:
        self.store = store
        self.fast_lane_port = 0

    @_translating
    def ServiceInfo(self, request, context):
        return pb.ServiceInfoResponse(version=__version__, fast_lane_port=self.fast_lane_port)

    @_translating
    def MountSegment(self, request, context):
        if not request.HasField("segment"):
            raise InvalidArgument("MountSegment needs a segment")
        self.store.mount_segment(wire.segment_from_pb(request.segment))
        return pb.MountSegmentResponse()

    @_translating
    def UnmountSegment(self, request, context):
        return pb.UnmountSegmentResponse(replicas_dropped=self.store.unmount_segment(request.segment_id))

    @_translating
    def Heartbeat(self, request, context):
        unknown = self.store.heartbeat(request.daemon_id, list(request.segment_ids))
        return pb.HeartbeatResponse(unknown_segment_ids=unknown,
                                    ttl_ms=int(self.store.config.heartbeat_ttl_s * 1000))

    @_translating
    def PutStart(self, request, context):
        results = self.store.put_start(list(request.keys), list(request.sizes), request.replica_num or 1)
        return pb.PutStartResponse(
            results=[pb.PutStartResult(status=wire.status_to_pb(r.code, r.message),
                                       replicas=[wire.grant_to_pb(g) for g in r.grants],
                                       retry_after_ms=r.retry_after_ms) for r in results],
            segments=_referenced_segments(self.store, (r.grants for r in results)))

    @_translating
    def PutEnd(self, request, context):
        results = self.store.put_end(list(request.keys), list(request.checksums))
        return pb.PutEndResponse(results=[wire.status_to_pb(r.code, r.message) for r in results])

    @_translating
    def PutRevoke(self, request, context):
        results = self.store.put_revoke(list(request.keys))
        return pb.PutRevokeResponse(results=[wire.status_to_pb(r.code, r.message) for r in results])

    @_translating
    def Get(self, request, context):
        results = self.store.get(list(request.keys), list(request.released))
        grant = wire.grant_to_pb
        return pb.GetResponse(   # an unset status reads as OK (code 0): most results leave it out
            results=[pb.GetResult(size=r.size, checksum=r.checksum, replicas=[grant(g) for g in r.grants],
                                  lease_id=r.lease_id)
                     if r.code is ErrorCode.OK else pb.GetResult(status=wire.status_to_pb(r.code, r.message))
                     for r in results],
            segments=_referenced_segments(self.store, (r.grants for r in results)),
            lease_ms=int(self.store.config.lease_ttl_s * 1000))

    @_translating
    def Exists(self, request, context):
        return pb.ExistsResponse(exists=self.store.exists(list(request.keys)))

    @_translating
    def MatchPrefix(self, request, context):
        return pb.MatchPrefixResponse(count=self.store.match_prefix(list(request.keys)))

    @_translating
    def Remove(self, request, context):
        results = self.store.remove(list(request.keys), request.force, list(request.released))
        return pb.RemoveResponse(results=[wire.status_to_pb(r.code, r.message) for r in results])

    @_translating
    def Pin(self, request, context):
        results = self.store.pin(list(request.keys), request.ttl_ms / 1000)
        return pb.PinResponse(results=[wire.status_to_pb(r.code, r.message) for r in results])

    @_translating
    def Unpin(self, request, context):
        results = self.store.unpin(list(request.keys))
        return pb.UnpinResponse(results=[wire.status_to_pb(r.code, r.message) for r in results])

    @_translating
    def ClaimMoves(self, request, context):
        tasks = self.store.claim_moves(request.daemon_id, request.max_bytes)
        return pb.ClaimMovesResponse(tasks=[wire.move_to_pb(t) for t in tasks])

    @_translating
    def CompleteMoves(self, request, context):
        self.store.complete_moves(request.daemon_id, [(r.move_id, r.ok, r.error) for r in request.results])
        return pb.CompleteMovesResponse()

    @_translating
    def AnnounceBlocks(self, request, context):
        results = self.store.announce(request.segment_id,
                                      [(b.key, b.offset, b.size, b.checksum) for b in request.blocks])
        return pb.AnnounceBlocksResponse(results=[wire.status_to_pb(r.code, r.message) for r in results])

    @_translating
    def Stats(self, request, context):
        return wire.stats_to_pb(self.store.stats())


class MetaServer:
    """A running metadata service: gRPC server, health service and the upkeep ticker."""

    def __init__(self, config: MetaConfig, store: MetaStore) -> None:
        self.config = config
        self.store = store
        self._stop = threading.Event()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="meta-rpc"),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.so_reuseport", 0)])
        servicer = MetaServicer(store)
        pb_grpc.add_MetaServiceServicer_to_server(servicer, self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self.port = self._server.add_insecure_port(f"{config.host}:{config.port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {config.host}:{config.port} (in use?)")
        self._ticker = threading.Thread(target=self._tick_loop, name="meta-tick", daemon=True)
        self._fast_lane = None
        if config.fast_lane:
            from kvstore.meta.fastlane import FastLaneServer

            self._fast_lane = FastLaneServer(servicer, config.host, config.fast_lane_port)
            servicer.fast_lane_port = self._fast_lane.port

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    def start(self) -> "MetaServer":
        self._server.start()
        if self._fast_lane is not None:
            self._fast_lane.start()
        self._ticker.start()
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("metadata service listening on %s", self.address)
        return self

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.config.tick_interval_s):
            try:
                self.store.tick()
            except Exception:  # noqa: BLE001 - keep ticking; the error is logged
                log.exception("metadata upkeep failed")

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        self._health.enter_graceful_shutdown()
        if self._fast_lane is not None:
            self._fast_lane.stop()
        self._server.stop(grace).wait()
        if self._ticker.is_alive():
            self._ticker.join(timeout=5)

    def wait(self) -> None:
        self._server.wait_for_termination()
