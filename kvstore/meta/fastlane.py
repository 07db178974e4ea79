"""The metadata service's fast lane server (see kvstore/fastrpc.py for the framing).

Every frame is handed to the same MetaServicer methods that gRPC calls, so both lanes share one
translation layer and one set of errors."""

from __future__ import annotations

import logging
import socket
import threading

import grpc

from kvstore import fastrpc
from kvstore.meta.service import MetaServicer

log = logging.getLogger(__name__)


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _FrameContext:
    """The part of grpc.ServicerContext the servicer uses."""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)


def _known_method(fields: tuple[int, int]) -> bool:
    return fields[1] < len(fastrpc.METHODS)


class FastLaneServer:
    def __init__(self, servicer: MetaServicer, host: str, port: int = 0) -> None:
        self._servicer = servicer
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.port = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, name="meta-fastlane", daemon=True)

    def start(self) -> "FastLaneServer":
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return                                   # listener closed: stopping
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="meta-fastlane-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        context = _FrameContext()
        try:
            while True:
                try:
                    (_, index), payload = fastrpc.recv_frame(conn, fastrpc.REQUEST, _known_method)
                except fastrpc.BadFrame as exc:
                    length, index = exc.fields
                    self._reply_error(conn, grpc.StatusCode.INVALID_ARGUMENT,
                                      f"bad frame (method {index}, {length} bytes): closing")
                    return
                method = fastrpc.METHODS[index]
                try:
                    request = method.request.FromString(payload)
                    response = getattr(self._servicer, method.name)(request, context)
                except _Abort as exc:
                    self._reply_error(conn, exc.code, exc.details)
                    continue
                except Exception as exc:  # noqa: BLE001 - a malformed message must not kill the lane
                    self._reply_error(conn, grpc.StatusCode.INVALID_ARGUMENT, f"cannot decode {method.name}: {exc}")
                    continue
                body = response.SerializeToString()
                fastrpc.send_frame(conn, fastrpc.RESPONSE.pack(len(body), fastrpc.OK), body)
        except (EOFError, OSError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _reply_error(conn: socket.socket, code: grpc.StatusCode, details: str) -> None:
        text = details.encode("utf-8", "replace")[:65536]
        fastrpc.send_frame(conn, fastrpc.RESPONSE.pack(len(text), code.value[0]), text)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            conns = list(self._conns)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)   # wakes the accept(); close() alone does not
        except OSError:
            pass
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
