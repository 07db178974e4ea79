"""What the bench's sections share: the options, the results so far, the store under test and
its clients. Sections register by name (`section`) and run in kvstore.bench.options'
SECTION_ORDER; those that need the store run while it is up."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvstore.bench.cpu import CpuMeter
from kvstore.bench.options import BenchOptions
from kvstore.bench.procs import LocalStore
from kvstore.bench.results import Results
from kvstore.bench.store import SourcePool
from kvstore.client import KVClient
from kvstore.config import ClientConfig


class ClientTarget:
    """A KVClient as the bench drives it (kvstore.bench.store.KVTarget)."""

    def __init__(self, client: KVClient) -> None:
        self.client = client

    def prepare(self, arrays: Sequence[np.ndarray]) -> None:
        pass  # nothing to register: every buffer is used where it lies

    def put(self, key: str, value: Any) -> bool:
        return self.client.put(key, value)

    def put_many(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        return self.client.put_many(keys, values)

    def get_into(self, key: str, buffer: Any) -> int:
        return self.client.get_into(key, buffer)

    def get_many_into(self, keys: Sequence[str], buffers: Sequence[Any]) -> list[Any]:
        return self.client.get_many_into(keys, buffers)

    def exists(self, key: str) -> bool:
        return self.client.exists(key)

    def match_prefix(self, keys: Sequence[str]) -> int:
        return self.client.match_prefix(keys)

    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Any]:
        return list(self.client.remove_many(keys, force))


@dataclass(frozen=True)
class KVPath:
    """One measured kvstore path: a writer and a reader client over one transport (two clients,
    so a read is never helped by what the writer knows)."""

    label: str
    writer: ClientTarget
    reader: ClientTarget


def progress(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class Context:
    def __init__(self, options: BenchOptions, results: Results) -> None:
        self.options = options
        self.results = results
        self.meta_address: str | None = None
        self.store: LocalStore | None = None  # the store the bench started (None with --meta)
        self.run_id = secrets.token_hex(4)  # keeps this run's keys apart in a shared store
        self.transports = list(options.transports)  # less any the started daemon could not serve
        self._paths: dict[str, KVPath] = {}
        self._pool: SourcePool | None = None

    def paths(self) -> Iterator[KVPath]:
        """Every kvstore path measured: one writer and one reader per transport."""
        assert self.meta_address, "a store section ran without a store"
        for transport in self.transports:
            if transport not in self._paths:
                config = ClientConfig(transports=(transport,))
                self._paths[transport] = KVPath(
                    transport,
                    ClientTarget(KVClient(self.meta_address, config)),
                    ClientTarget(KVClient(self.meta_address, config)),
                )
            yield self._paths[transport]

    @property
    def pool(self) -> SourcePool:
        """The source bytes every put of the run takes its values from."""
        if self._pool is None:
            opts = self.options
            self._pool = SourcePool(max(opts.plan.pool_bytes(opts.sizes), opts.latency.ops * opts.latency.size))
        return self._pool

    def server_cpu(self) -> CpuMeter | None:
        """A CPU clock of the metadata service and daemon the bench started (None with --meta)."""
        if self.store is None or not CpuMeter.available():
            return None
        return CpuMeter([p.pid for p in self.store.procs], "meta + daemon")

    def key_prefix(self, *parts: object) -> str:
        return "/".join(["bench", self.run_id, *map(str, parts)])

    def close_clients(self) -> None:
        for path in self._paths.values():
            path.writer.client.close()
            path.reader.client.close()
        self._paths.clear()


@dataclass(frozen=True)
class Section:
    name: str
    needs_store: bool
    run: Callable[[Context], None]


SECTIONS: dict[str, Section] = {}


def section(name: str, needs_store: bool) -> Callable[[Callable[[Context], None]], Callable[[Context], None]]:
    def register(fn: Callable[[Context], None]) -> Callable[[Context], None]:
        SECTIONS[name] = Section(name, needs_store, fn)
        return fn

    return register
