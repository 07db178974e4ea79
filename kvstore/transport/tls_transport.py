"""The `tls` transport: the tcp transport's protocol inside TLS, for a data plane that crosses a
network nobody should read. The daemon serves it on tls_port with its tls_cert; a client checks
the daemon's certificate against its tls_ca (a CA bundle, or the daemon's certificate itself)
and the host it dialled. Grants bind every byte range as on tcp; TLS adds secrecy and integrity
on the wire. Bytes move a TLS record at a time (no sendmsg, recvmsg_into or sendfile through
TLS), which is what it costs: `kvstore bench` measures it against tcp."""

from __future__ import annotations

import socket
import ssl
import time

from kvstore.clock import Clock
from kvstore.config import ClientConfig, DaemonConfig
from kvstore.errors import TransportError
from kvstore.tls import TlsFiles, client_context, server_context
from kvstore.transport.base import GrantChecker
from kvstore.transport.tcp_client import TcpTransport
from kvstore.transport.tcp_server import TcpServer


class TlsServer(TcpServer):
    name = "tls"

    def __init__(self, checker: GrantChecker, config: DaemonConfig) -> None:
        super().__init__(checker, config)
        self._context = server_context(TlsFiles(config.tls_cert, config.tls_key))
        self._handshake_s = config.header_timeout_s

    @staticmethod
    def _port(config: DaemonConfig) -> int:
        return config.tls_port

    def _open(self, conn: socket.socket) -> socket.socket:
        """The TLS handshake, within the header timeout (OSError if it fails)."""
        wrapped = self._context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        with self._lock:  # stop() must shut the wrapped socket down: the plain one is detached
            thread = self._conns.pop(conn, None)
            if thread is not None:
                self._conns[wrapped] = thread
        wrapped.settimeout(self._handshake_s)
        wrapped.do_handshake()
        return wrapped


class TlsTransport(TcpTransport):
    name = "tls"

    def __init__(self, config: ClientConfig | None = None, clock: Clock | None = None) -> None:
        super().__init__(config, clock)
        cfg = config or ClientConfig()
        self._context = client_context(TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_ca))
        self._server_name = cfg.tls_server_name

    def _dial(self, address: str, deadline: float) -> socket.socket:
        sock = super()._dial(address, deadline)
        host = address.rpartition(":")[0].strip("[]")
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            wrapped = self._context.wrap_socket(sock, server_hostname=self._server_name or host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise TransportError(
                f"TLS with the daemon at {address} failed: {exc}; check the client's tls_ca (the daemon's CA, or "
                "its certificate) and that the certificate names the host dialled (or set tls_server_name)"
            ) from exc
        return wrapped
