"""A client on a fleet host (`python -m tests.fleet.driver MODE ...`, started inside the host's
namespace), recording every operation to a history (tests/fleet/history.py).

    stream  puts batches of new keys, reads keys already put, removes a few, until a line
            `stop` (or EOF) arrives on stdin; prints `driver ready` first, `driver done` last.
            With --pause-pid, a line `arm` makes it SIGSTOP that process (the leader) on its next
            metadata call named --pause-in (Get, PutEnd...), --pause-ms after sending it, and
            print `driver paused`: the call is in flight when the service stops
    verify  reads back every key the given histories put (phase "final"), retrying an
            acknowledged key whose read fails (but with KeyNotFound: the settled fleet's answer)
            until it reads or --within seconds pass
    puts    --count put batches in a row; prints how many were acknowledged
    links   puts and reads --count values of --mib MiB, then prints the link monitor's figures
            as one JSON line `links: [...]`

Values are a deterministic function of (seed, key), sized 4-32 KiB, so a read of another key's
bytes cannot match. The token comes from $KVSTORE_TOKEN.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.errors import KeyNotFound, KVStoreError
from kvstore.wire.call import Call
from tests.fleet.history import HistoryWriter, digest, read_history

MAX_VALUE = 32 << 10
DEADLINES = 4  # an operation's deadline, in the client's timeout_s (metadata call, transfer, commit, retry)


def value_of(seed: int, key: str) -> bytes:
    size = 4096 + int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest()) % (MAX_VALUE - 4096)
    return hashlib.shake_128(f"{seed}:{key}".encode()).digest(size)


class Tap:
    """The client's metadata calls, watched: which service answered the last one (the checker's
    Op.leader), and, once armed, a SIGSTOP of a process while a call of one kind is in flight."""

    def __init__(self, client: KVClient) -> None:
        self.meta, self._call, self._begin = client.meta, client.meta.call, client.meta.begin
        self.answered: str | None = None  # the service that answered a call since the op began
        self.last: str | None = None  # ... the last call ever
        self.pause: tuple[int, str, float] | None = None  # (pid, call name, seconds after sending)
        self.armed = threading.Event()
        client.meta.call = self._tapped  # type: ignore[method-assign]
        client.meta.begin = self._tapped_begin  # type: ignore[method-assign]  # a large read's runs

    def _tapped(self, req: Call[Any], timeout_s: float | None = None, retry_s: float = 0.0) -> Any:
        self._arm(req)
        reply = self._call(req, timeout_s, retry_s)
        self.answered = self.last = self.meta.current
        return reply

    def _tapped_begin(self, req: Call[Any], timeout_s: float | None = None) -> Callable[[], Any]:
        self._arm(req)
        wait = self._begin(req, timeout_s)

        def answer() -> Any:
            reply = wait()
            self.answered = self.last = self.meta.current
            return reply

        return answer

    def _arm(self, req: Call[Any]) -> None:
        if self.pause is not None and type(req).__name__ == self.pause[1] and self.armed.is_set():
            self.armed.clear()
            pid, name, after = self.pause
            threading.Timer(after, self._stop, (pid, name, after)).start()

    @staticmethod
    def _stop(pid: int, name: str, after: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        print(f"driver paused {pid} {after * 1000:.1f} ms into a {name}", flush=True)


class Recorder:
    """Runs batch calls on a KVClient, one history record per key."""

    def __init__(self, client: KVClient, history: HistoryWriter, deadline_s: float, phase: str = "run") -> None:
        self.client, self.history, self.deadline_s, self.phase = client, history, deadline_s, phase
        self.tap = Tap(client)

    def _invoke(self, op: str, keys: list[str], digests: list[str | None]) -> list[str]:
        self.tap.answered = None
        return [self.history.invoke(op, k, self.deadline_s, d, self.phase) for k, d in zip(keys, digests)]

    def _complete(
        self, op_id: str, ok: bool, read_digest: str | None = None, error: BaseException | None = None
    ) -> None:
        """Recorded with the service that answered this op's metadata call, or (none answered: a
        read on cached locations) the last one that answered, as not fresh."""
        leader = self.tap.answered or self.tap.last
        self.history.complete(op_id, ok, read_digest, error, leader, fresh=self.tap.answered is not None)

    def put(self, keys: list[str], values: list[bytes]) -> list[bool]:
        ids = self._invoke("put", keys, [digest(v) for v in values])
        try:
            self.client.put_many(keys, values)
        except Exception as exc:  # noqa: BLE001 - any error, typed or not, is recorded: the checker judges it
            for op_id in ids:
                self._complete(op_id, False, error=exc)
            return [False] * len(keys)
        for op_id in ids:
            self._complete(op_id, True)
        return [True] * len(keys)

    def get(self, keys: list[str]) -> list[BaseException | None]:
        """Each key's error, None where it was read."""
        ids = self._invoke("get", keys, [None] * len(keys))
        buffers = [bytearray(MAX_VALUE) for _ in keys]
        try:
            results = self.client.get_many_into(keys, buffers, strict=False)
        except Exception as exc:  # noqa: BLE001 - recorded, as above
            results = [exc] * len(keys)
        for op_id, buf, got in zip(ids, buffers, results):
            if isinstance(got, BaseException):
                self._complete(op_id, False, error=got)
            else:
                self._complete(op_id, True, digest(memoryview(buf)[:got]))
        return [r if isinstance(r, BaseException) else None for r in results]

    def remove(self, keys: list[str]) -> list[bool]:
        ids = self._invoke("remove", keys, [None] * len(keys))
        try:
            errors: list[BaseException | None] = list(self.client.remove_many(keys))
        except Exception as exc:  # noqa: BLE001 - recorded, as above
            errors = [exc] * len(keys)
        for op_id, err in zip(ids, errors):
            self._complete(op_id, err is None, error=err)
        return [e is None for e in errors]


def _client(args: argparse.Namespace) -> KVClient:
    return KVClient(args.meta, ClientConfig(timeout_s=args.timeout))


def stream(args: argparse.Namespace) -> None:
    stop = threading.Event()

    rng = random.Random(args.seed)
    history = HistoryWriter(Path(args.history), args.client, args.tenant)
    written: list[str] = []
    acked: list[str] = []
    n = 0
    with _client(args) as client:
        rec = Recorder(client, history, DEADLINES * args.timeout)
        if args.pause_pid:
            rec.tap.pause = (args.pause_pid, args.pause_in, args.pause_ms / 1000)

        def watch_stdin() -> None:
            for line in sys.stdin:
                if line.strip() == "stop":
                    break
                if line.strip() == "arm":
                    rec.tap.armed.set()
            stop.set()

        threading.Thread(target=watch_stdin, daemon=True).start()
        print("driver ready", flush=True)
        while not stop.is_set():
            r = rng.random()
            if r < 0.5 or not written:
                keys = [f"{args.client}/{args.seed}/{n}/{i}" for i in range(args.batch)]
                n += 1
                written += keys
                ok = rec.put(keys, [value_of(args.seed, k) for k in keys])
                acked += [k for k, o in zip(keys, ok) if o]
                if not all(ok):
                    stop.wait(0.05)  # back off a little, as an engine would
            elif r < 0.92 or not acked:
                rec.get(rng.sample(written, min(args.batch, len(written))))
            else:
                rec.remove([acked.pop(rng.randrange(len(acked)))])
    history.close()
    print(f"driver done puts={len(written)} acked={len(acked)}", flush=True)


def verify(args: argparse.Namespace) -> None:
    ops = read_history(Path(p) for p in args.read)
    expected = {o.key: o.digest for o in ops if o.op == "put"}
    removed = {o.key for o in ops if o.op == "remove"}
    must = {o.key for o in ops if o.op == "put" and o.ok} - removed  # what must read back in the end
    history = HistoryWriter(Path(args.history), args.client, args.tenant)
    pending = sorted(expected)
    deadline = time.monotonic() + args.within
    with _client(args) as client:
        rec = Recorder(client, history, DEADLINES * args.timeout, phase="final")
        while pending:
            again = []
            for start in range(0, len(pending), 32):
                keys = pending[start : start + 32]
                # A miss once the fleet settled is the answer; a transport error may pass.
                got = rec.get(keys)
                again += [
                    k for k, e in zip(keys, got) if e is not None and not isinstance(e, KeyNotFound) and k in must
                ]
            if not again or time.monotonic() > deadline:
                break
            pending = again
            time.sleep(0.2)  # a retry's pace, not a wait for a condition: the loop ends on success
    history.close()
    print(f"driver verified {len(expected)} keys", flush=True)


def puts(args: argparse.Namespace) -> None:
    """--count put batches one after the other; prints `acked N of M batches`."""
    history = HistoryWriter(Path(args.history), args.client, args.tenant)
    with _client(args) as client:
        rec = Recorder(client, history, DEADLINES * args.timeout)
        keys = [[f"{args.client}/puts/{args.seed}/{n}/{i}" for i in range(args.batch)] for n in range(args.count)]
        acked = sum(all(rec.put(batch, [value_of(args.seed, k) for k in batch])) for batch in keys)
    history.close()
    print(f"acked {acked} of {args.count} batches", flush=True)


def links(args: argparse.Namespace) -> None:
    size = int(args.mib * (1 << 20))
    with _client(args) as client:
        keys = [f"{args.client}/links/{args.seed}/{i}" for i in range(args.count)]
        for k in keys:
            client.put(k, (value_of(args.seed, k) * (size // 4096 + 1))[:size])
        for k in keys:
            client.get(k)
        print("links: " + json.dumps([s.to_dict() for s in client.links()]), flush=True)


def main(argv: list[str] | None = None) -> None:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack, to see a hang
    p = argparse.ArgumentParser(prog="python -m tests.fleet.driver")
    p.add_argument("mode", choices=["stream", "verify", "puts", "links"])
    p.add_argument("--meta", required=True)
    p.add_argument("--history", default="")
    p.add_argument("--client", default="c1")
    p.add_argument("--tenant", default="admin")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--read", nargs="*", default=[])
    p.add_argument("--within", type=float, default=30.0)
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--mib", type=float, default=1.0)
    p.add_argument("--pause-pid", type=int, default=0)
    p.add_argument("--pause-in", default="PutEnd")
    p.add_argument("--pause-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    try:
        {"stream": stream, "verify": verify, "puts": puts, "links": links}[args.mode](args)
    except KVStoreError as exc:
        print(f"driver failed: {type(exc).__name__}: {exc}", flush=True)
        raise SystemExit(1) from exc


if __name__ == "__main__":
    main()
