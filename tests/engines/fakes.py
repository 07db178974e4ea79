"""In-memory stand-ins for the store client, so engine logic is tested without servers."""

from __future__ import annotations

import threading

from kvstore.client.buffers import byte_view
from kvstore.config import ClientConfig
from kvstore.errors import KeyNotFound, TransportError


class MemoryStore:
    """put_many / get_many_into / match_prefix over a dict. `fail_keys` fail on read;
    `gate`, when set, makes every read wait for it (a slow link)."""

    def __init__(self) -> None:
        self.config = ClientConfig()  # as a KVClient's (the engine reports its replica_num)
        self.objects: dict[str, bytes] = {}
        self.fail_keys: set[str] = set()
        self.gate: threading.Event | None = None
        self.reads = 0

    def put(self, key, value) -> bool:
        return self.put_many([key], [value])[0]

    def get(self, key) -> bytes:
        if key not in self.objects:
            raise KeyNotFound(key)
        return self.objects[key]

    def put_many(self, keys, values) -> list[bool]:
        out = []
        for k, v in zip(keys, values):
            out.append(k not in self.objects)
            self.objects.setdefault(k, bytes(byte_view(v, writable=False)))
        return out

    def get_many_into(self, keys, buffers, strict=True):
        if self.gate is not None:
            self.gate.wait()
        self.reads += 1
        out: list[int | Exception] = []
        for k, b in zip(keys, buffers):
            if k in self.fail_keys:
                out.append(TransportError(f"injected: {k}"))
            elif k not in self.objects:
                out.append(KeyNotFound(k))
            else:
                view = byte_view(b, writable=True)
                data = self.objects[k]
                view[: len(data)] = data
                out.append(len(data))
        return out

    def match_prefix(self, keys) -> int:
        n = 0
        while n < len(keys) and keys[n] in self.objects:
            n += 1
        return n
