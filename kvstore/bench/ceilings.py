"""Ceilings measured in the same run as the store: one-thread memcpy, and raw loopback TCP.

The socket ceiling streams preallocated buffers from a child process (`sendall`) into one
preallocated buffer here (`recv_into`): no framing, no grants, no Python per byte. Both ends use
the same socket options as the tcp transport (TCP_NODELAY, 4 MiB buffers). Streaming lets the
sender's copy-in overlap the receiver's copy-out; a get cannot overlap them across requests, so
the request/reply variant (8-byte request, SIZE-byte reply) is measured too, for comparison.

Run as `python -m kvstore.bench.ceilings {send|serve} PORT SIZE COUNT` it is that child.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np

from kvstore.bench.results import Ceiling, Spread

SOCKET_BUFFER = 4 << 20


def memcpy(size: int, repeats: int = 3, min_bytes: int = 256 << 20) -> Ceiling:
    """np.copyto of `size` bytes, `repeats` times; small sizes loop to at least `min_bytes`."""
    src = np.ones(size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault every page in before timing
    loops = max(1, min_bytes // size)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(loops):
            np.copyto(dst, src)
        runs.append(size * loops / (time.perf_counter() - t0) / 1e9)
    return Ceiling("memcpy", size, Spread.of(runs))


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
        if n == 0:
            raise ConnectionError("sender closed early")
        got += n


def tcp_socket(
    size: int, repeats: int = 3, round_bytes: int = 256 << 20, request_reply: bool = False, timeout: float = 60.0
) -> Ceiling:
    """Loopback TCP from a child process, `repeats` rounds of ~`round_bytes` each; with
    `request_reply` each message is sent only once asked for."""
    per_round = max(2, round_bytes // size)
    count = 1 + per_round * repeats  # one untimed message first: connection warm-up
    mode = "serve" if request_reply else "send"
    request = b"get\0\0\0\0\0"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(timeout)
        port = listener.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-m", "kvstore.bench.ceilings", mode, str(port), str(size), str(count)]
        )
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(timeout)
                _tune(conn)
                view = memoryview(bytearray(size))

                def receive() -> None:
                    if request_reply:
                        conn.sendall(request)
                    _recv_exact(conn, view)

                receive()
                runs = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(per_round):
                        receive()
                    runs.append(size * per_round / (time.perf_counter() - t0) / 1e9)
            child.wait(timeout=timeout)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    name = "tcp req/reply" if request_reply else "tcp socket"
    return Ceiling(name, size, Spread.of(runs))


def _send(port: int, size: int, count: int, on_request: bool) -> None:
    payload = memoryview(bytearray(b"\x5a" * size))
    request = memoryview(bytearray(8))
    with socket.create_connection(("127.0.0.1", port)) as sock:
        _tune(sock)
        for _ in range(count):
            if on_request:
                _recv_exact(sock, request)
            sock.sendall(payload)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("send", "serve"):
        sys.exit("usage: python -m kvstore.bench.ceilings {send|serve} PORT SIZE COUNT")
    _send(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), on_request=sys.argv[1] == "serve")
