"""A TCP relay a test can cut: a real network partition between a client and a server.

In use:
    relay = Relay(port_of_server); client connects to relay.port
    relay.cut()    every connection through it is closed, and new ones are closed on arrival
    relay.heal()   connections are relayed again (clients that retry, as ZMQ does, come back)

RetargetableRelay: a relay whose target can change while its port stays (one address for a server
that was replaced).
"""

from __future__ import annotations

import socket
import threading


class Relay:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            doomed, self._open = self._open, set()
        for s in doomed:
            _close(s)

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                _close(client)
                continue
            try:
                server = socket.create_connection(self._target)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._open |= {client, server}
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with self._lock:
                self._open.discard(s)
            _close(s)


class RetargetableRelay:
    """Listens on a port of its own and relays each connection to `target` (a port on 127.0.0.1),
    half-closes included: one host:port that stands for one engine, then for another (a new
    `target`)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                conn.close()
                continue
            ends = [conn, upstream]
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst, ends), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, ends: list[socket.socket]) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
            ends.pop()
            if ends:  # the other direction still runs: it closes both
                return
        except OSError:
            pass
        src.close()
        dst.close()

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
