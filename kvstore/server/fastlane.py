"""The metadata service's fast lane server (see kvstore/wire/frames.py for the framing).

Every frame is handed to the same MetaHandlers that gRPC calls, so both lanes share one
translation layer and one set of errors. A connection authenticates with the token in its HELLO,
and is checked again on a call whenever the tenant registry changed since (auth.Session: a
takeover, a rebuild, a tenant or token changed), so what a token grants is what the registry
of the store answering says now. A token that is missing or unknown, or revoked or expired
later, gets an error frame and the connection closed. With a TLS context, a connection speaks
TLS from its first byte."""

from __future__ import annotations

import logging
import socket
import ssl
import threading

from kvstore.connlimit import Admission, Limits, peer_host
from kvstore.errors import InvalidArgument, KVStoreError, Unauthenticated, Unavailable
from kvstore.server.auth import Authenticator, Session
from kvstore.server.handlers import MetaHandlers
from kvstore.v1 import meta_pb2 as pb
from kvstore.version import __version__
from kvstore.wire import convert, frames

log = logging.getLogger(__name__)


def _known_method(fields: tuple[int, ...]) -> bool:
    return fields[1] in frames.METHODS


def _is_hello(fields: tuple[int, ...]) -> bool:
    return fields[1] == frames.HELLO


def _refuse(conn: socket.socket, why: str) -> None:
    """Tell a connection over the caps why (an error frame), and close it, never blocking."""
    try:
        conn.setblocking(False)
        conn.send(_error_frame(Unavailable(f"metadata fast lane: {why}")))
    except OSError:
        pass
    finally:
        conn.close()


def _error_frame(err: KVStoreError) -> bytes:
    return frames.response_frame(convert.error_to_pb(err).SerializeToString(), int(err.code))


class FastLaneServer:
    """An accept thread and a thread per connection, under connection caps; a connection idle
    past its timeout, or whose frame dawdles past the header timeout, is closed."""

    def __init__(
        self,
        handlers: MetaHandlers,
        auth: Authenticator,
        host: str,
        port: int = 0,
        limits: Limits | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._handlers = handlers
        self._auth = auth
        self._tls = tls
        self._admission = Admission(limits or Limits())
        self._listener = socket.create_server((host, port), reuse_port=False)
        self.port = self._listener.getsockname()[1]
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, name="meta-fastlane", daemon=True)

    def start(self) -> FastLaneServer:
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, address = self._listener.accept()
            except OSError:
                return  # listener closed: stopping
            peer = peer_host(address)
            refusal = self._admission.admit(peer)
            if refusal:
                _refuse(conn, refusal)
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self._admission.limits.idle_timeout_s)
            with self._lock:
                if self._stopped:
                    conn.close()
                    self._admission.release(peer)
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer), name="meta-fastlane-conn", daemon=True).start()

    @property
    def connections(self) -> int:
        return self._admission.open

    def _serve(self, conn: socket.socket, peer: str) -> None:
        raw = conn
        try:
            if self._tls is not None:
                conn = self._secure(conn)
            session = self._greet(conn)
            while session is not None and self._serve_one(conn, session):
                pass
        except (EOFError, OSError):
            pass  # gone, idle past the timeout, a frame that dawdled, or a failed TLS handshake
        finally:
            with self._lock:
                self._conns.discard(raw)
                self._conns.discard(conn)
            conn.close()
            self._admission.release(peer)

    def _secure(self, conn: socket.socket) -> ssl.SSLSocket:
        """The TLS handshake, within the header timeout (OSError if it fails)."""
        assert self._tls is not None
        wrapped = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        with self._lock:
            self._conns.discard(conn)
            self._conns.add(wrapped)
        wrapped.settimeout(self._admission.limits.header_timeout_s)
        wrapped.do_handshake()
        wrapped.settimeout(self._admission.limits.idle_timeout_s)
        return wrapped

    def _greet(self, conn: socket.socket) -> Session | None:
        """Take the client's HELLO; answer WELCOME, or an error (and close: None) for another
        protocol or a token the service does not accept."""
        try:
            _, payload = frames.recv_frame(
                conn, frames.REQUEST, _is_hello, max_frame=4096, rest_timeout=self._admission.limits.header_timeout_s
            )
            hello = pb.FastLaneHello.FromString(payload)
        except frames.BadFrame:
            conn.sendall(_error_frame(InvalidArgument("the fast lane opens with a HELLO frame: closing")))
            return None
        except (EOFError, OSError):
            raise
        except Exception:  # noqa: BLE001 - an undecodable hello: refuse it
            conn.sendall(_error_frame(InvalidArgument("undecodable fast-lane HELLO: closing")))
            return None
        if hello.protocol != frames.PROTOCOL:
            refusal = InvalidArgument(
                f"fast lane protocol {hello.protocol} is not this service's ({frames.PROTOCOL}, kvstore "
                f"{__version__}); use gRPC"
            )
            conn.sendall(_error_frame(refusal))
            return None
        try:
            session = self._auth.session(hello.token)
        except Unauthenticated as exc:
            conn.sendall(_error_frame(exc))
            return None
        welcome = pb.FastLaneWelcome(protocol=frames.PROTOCOL, server_version=__version__)
        conn.sendall(frames.response_frame(welcome.SerializeToString()))
        return session

    def _serve_one(self, conn: socket.socket, session: Session) -> bool:
        """Answer one call; False when the connection must close."""
        try:
            (length, method_id), payload = frames.recv_frame(
                conn, frames.REQUEST, _known_method, rest_timeout=self._admission.limits.header_timeout_s
            )
        except frames.BadFrame as exc:
            length, method_id = exc.fields
            conn.sendall(_error_frame(InvalidArgument(f"bad frame (method {method_id}, {length} bytes): closing")))
            return False
        method = frames.METHODS[method_id]
        try:
            who = self._auth.current(session)
        except Unauthenticated as exc:
            conn.sendall(_error_frame(Unauthenticated(f"{exc} (this connection's token): closing")))
            return False
        try:
            request = method.request.FromString(payload)
        except Exception as exc:  # noqa: BLE001 - a malformed message must not kill the lane
            conn.sendall(_error_frame(InvalidArgument(f"cannot decode {method.name}: {exc}")))
            return True
        try:
            response = self._handlers.handler(method.name)(request, who)
        except KVStoreError as exc:
            conn.sendall(_error_frame(exc))
            return True
        except Exception as exc:
            log.exception("internal error in %s", method.name)
            conn.sendall(_error_frame(KVStoreError(f"internal error in {method.name}: {exc}")))
            return True
        body = response.SerializeToString()
        frames.send_frame(conn, frames.RESPONSE.pack(len(body), frames.OK), body)
        return True

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            conns = list(self._conns)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
        except OSError:
            pass
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
