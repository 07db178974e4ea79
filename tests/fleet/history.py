"""The history of a fault run: every client operation as two JSON lines, written when it is
invoked and when it completes, so an operation that never returns shows as invoked only.

    {"event": "invoke", "id": "c1:7", "client": "c1", "tenant": "t", "op": "put", "key": "k",
     "digest": "<digest of the bytes written>", "deadline_s": 20.0, "phase": "run", "t": 12.5}
    {"event": "complete", "id": "c1:7", "ok": true, "digest": null, "error": null, "message": "",
     "leader": "10.213.1.3:41234", "fresh": true, "t": 12.6}

A leadership watch (tests/fleet/watch.py) writes a third kind of line to a file of its own: what a
service said of itself, asked from the root namespace (which no partition cuts off):

    {"event": "sighting", "service": "10.213.1.3:41234", "role": "leader", "epoch": 2,
     "invoke": 12.4, "t": 12.5}

`t` is time.monotonic(): CLOCK_MONOTONIC, one clock for every process on the machine, so the
histories of clients in different namespaces merge. A get's completion carries the digest of
the bytes it read; an error is its exception's class name. Imports nothing from kvstore.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


def digest(data: bytes | bytearray | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


@dataclass
class Op:
    """One operation on one key, both halves merged. complete is None: it never returned."""

    id: str
    client: str
    tenant: str
    op: str  # put | get | remove
    key: str
    invoke: float
    deadline_s: float
    phase: str = "run"  # run (during the faults) | final (the read-back after healing)
    complete: float | None = None
    ok: bool | None = None
    digest: str | None = None  # put: the bytes written; get: the bytes read (when ok)
    error: str | None = None
    message: str = ""
    leader: str | None = None  # the service that answered its metadata call (see `fresh`)
    fresh: bool = True  # False: no metadata call answered during it (a read on cached locations)


@dataclass(frozen=True)
class Sighting:
    """A service answered, between `invoke` and `complete`, that it is `role` at `epoch`."""

    service: str
    role: str  # leader | standby
    epoch: int
    invoke: float
    complete: float


class HistoryWriter:
    """Appends one client's operations to a JSONL file, a line at a time, flushed (thread safe)."""

    def __init__(self, path: Path, client: str, tenant: str) -> None:
        self.client, self.tenant = client, tenant
        self._fh: IO[str] = path.open("a")
        self._lock = threading.Lock()
        self._n = 0

    def _write(self, line: dict[str, Any]) -> None:
        with self._lock:
            self._fh.write(json.dumps(line) + "\n")
            self._fh.flush()

    def invoke(self, op: str, key: str, deadline_s: float, put_digest: str | None = None, phase: str = "run") -> str:
        with self._lock:
            self._n += 1
            op_id = f"{self.client}:{self._n}"
        self._write({"event": "invoke", "id": op_id, "client": self.client, "tenant": self.tenant, "op": op,
                     "key": key, "digest": put_digest, "deadline_s": deadline_s, "phase": phase,
                     "t": time.monotonic()})  # fmt: skip
        return op_id

    def complete(
        self,
        op_id: str,
        ok: bool,
        read_digest: str | None = None,
        error: BaseException | None = None,
        leader: str | None = None,
        fresh: bool = True,
    ) -> None:
        self._write({"event": "complete", "id": op_id, "ok": ok, "digest": read_digest,
                     "error": type(error).__name__ if error is not None else None,
                     "message": str(error)[:200] if error is not None else "", "leader": leader,
                     "fresh": fresh, "t": time.monotonic()})  # fmt: skip

    def close(self) -> None:
        self._fh.close()


def read_history(paths: Iterable[Path]) -> list[Op]:
    """Every operation in the files, in invoke order. A file's last line may be cut short (its
    writer was killed): it is skipped."""
    ops: dict[str, Op] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") not in ("invoke", "complete"):
                continue
            if rec["event"] == "invoke":
                ops[rec["id"]] = Op(rec["id"], rec["client"], rec["tenant"], rec["op"], rec["key"], rec["t"],
                                    rec["deadline_s"], rec["phase"], digest=rec["digest"])  # fmt: skip
            elif (op := ops.get(rec["id"])) is not None:
                op.complete, op.ok, op.error = rec["t"], rec["ok"], rec["error"]
                op.message, op.leader, op.fresh = rec["message"], rec["leader"], rec.get("fresh", True)
                if op.op == "get":
                    op.digest = rec["digest"]
    return sorted(ops.values(), key=lambda o: o.invoke)


def sighting_line(sighting: Sighting) -> str:
    return json.dumps({"event": "sighting", "service": sighting.service, "role": sighting.role,
                       "epoch": sighting.epoch, "invoke": sighting.invoke, "t": sighting.complete})  # fmt: skip


def read_sightings(paths: Iterable[Path]) -> list[Sighting]:
    """Every sighting in the files, in invoke order (a line cut short is skipped)."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "sighting":
                out.append(Sighting(rec["service"], rec["role"], rec["epoch"], rec["invoke"], rec["t"]))
    return sorted(out, key=lambda s: s.invoke)
