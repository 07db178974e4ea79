"""LMCache's own multi-process server (`lmcache server`, CPU) with kvstore as its L2, loaded by
LMCache's `--l2-adapter` plug-in loader: two servers, standing for two hosts, share one kvstore.
LMCache's own client (its engine-driven transfer context, as its SDK uses it) stores a prompt's
KV through the first server; the second, whose L1 is empty, finds the prompt in kvstore, loads
it, and hands it back byte-identical."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore.client import KVClient
from tests.cluster import wait_until
from tests.compat.conftest import python_env

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lmcache") is None, reason="LMCache is not installed: run scripts/install_lmcache.sh"
)
LAYERS, HEADS, BLOCK, HEAD_DIM, CHUNK = 2, 2, 16, 8, 16
MODEL = "org/model-1b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_args(meta: str, port: int, http_port: int) -> list[str]:
    """The launch line docs/compat-lmcache.md gives, on a CPU host."""
    adapter = {
        "type": "plugin",
        "module_path": "kvstore.compat.lmcache.l2_adapter",
        "class_name": "KVStoreL2Adapter",
        "adapter_params": {"meta": meta},
    }
    lmcache = str(Path(sys.executable).with_name("lmcache"))
    return [
        lmcache, "server", "--host", "127.0.0.1", "--port", str(port), "--http-port", str(http_port),
        "--chunk-size", str(CHUNK), "--l1-size-gb", "0.1", "--no-l1-use-lazy", "--eviction-policy", "LRU",
        "--supported-transfer-mode", "engine_driven", "--disable-observability",
        "--l2-adapter", json.dumps(adapter),
    ]  # fmt: skip


def status(http_port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status", timeout=5) as reply:
            return dict(json.load(reply))
    except OSError:
        return None


def l2_status(http_port: int) -> dict[str, Any]:
    found = status(http_port)
    assert found is not None
    return dict(found["storage_manager"]["l2_adapters"][0])


@pytest.fixture
def lmcache_servers(cluster, tmp_path) -> Iterator[tuple[str, list[tuple[int, int]]]]:
    """Two `lmcache server`s over one `kvstore serve`: (meta, [(port, http_port)] * 2), each waited
    for by its HTTP status naming the kvstore adapter."""
    _, meta = cluster.serve("64MiB")
    procs: list[subprocess.Popen[bytes]] = []
    ports = [(free_port(), free_port()) for _ in range(2)]
    try:
        for n, (port, http_port) in enumerate(ports):
            log = (tmp_path / f"lmcache-{n}.log").open("wb")
            env = python_env(LMCACHE_DISABLE_BANNER="1")
            procs.append(subprocess.Popen(server_args(meta, port, http_port), stdout=log, stderr=log, env=env))
        for proc, (n, (_, http_port)) in zip(procs, enumerate(ports)):

            def up(proc=proc, n=n, http_port=http_port) -> bool:
                assert proc.poll() is None, (tmp_path / f"lmcache-{n}.log").read_text()[-4000:]
                found = status(http_port)
                return found is not None and l2_status(http_port)["type"] == "KVStoreL2Adapter"

            wait_until(up, timeout=180, what=f"lmcache server {n}")
        yield meta, ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Worker:
    """LMCache's own client side, as its SDK builds it: a CPU KV cache registered with the server
    through the engine-driven transfer context, then contiguous stores and retrieves."""

    def __init__(self, port: int) -> None:
        import torch
        import zmq
        from lmcache.sdk.wrapper.contiguous import ContiguousTransferWrapper
        from lmcache.v1.gpu_connector.utils import LayoutHints
        from lmcache.v1.multiprocess.transfer_context.worker_transfer import create_transfer_context
        from lmcache.v1.multiprocess.transport.factory import RequestClientFactory

        self._zmq = zmq.Context()
        self.requests = RequestClientFactory.create(f"tcp://127.0.0.1:{port}", context=self._zmq)
        self.instance_id = uuid.uuid4().int & ((1 << 63) - 1)
        caches = {f"layer.{i}": torch.zeros((1, 2, HEADS, BLOCK, HEAD_DIM), dtype=torch.float16) for i in range(LAYERS)}
        context = create_transfer_context(
            caches, instance_id=self.instance_id, req_client=self.requests, mode="engine_driven"
        )
        hints = LayoutHints(kv_layout="HND", num_kv_heads=HEADS, tokens_per_block=BLOCK, head_dim=HEAD_DIM)
        context.register(caches, MODEL, 1, CHUNK // BLOCK, 60, layout_hints=hints)
        self.transfer = ContiguousTransferWrapper(context.engine_driven_context, CHUNK)

    def key(self, tokens: list[int], request_id: str, worker_id: int | None) -> Any:
        from lmcache.v1.multiprocess.custom_types import IPCCacheServerKey

        return IPCCacheServerKey(
            model_name=MODEL, world_size=1, num_kv_readers=1, worker_id=worker_id, token_ids=tuple(tokens),
            start=0, end=len(tokens), request_id=request_id, cache_salt="", request_configs=None,
        )  # fmt: skip

    def store(self, tokens: list[int], kv: Any) -> bool:
        request = f"store-{uuid.uuid4().hex}"
        try:
            return bool(self.transfer.store(self.key(tokens, request, 0), self.instance_id, kv))
        finally:
            self.requests.end_session(request).result(timeout=60)

    def retrieve(self, tokens: list[int]) -> tuple[int, Any]:
        """(chunks found, the KV of that prefix or None): a lookup, its prefetch, the retrieve."""
        request = f"retrieve-{uuid.uuid4().hex}"
        try:
            self.requests.lookup(self.key(tokens, request, None).no_worker_id_version(), 1).result(timeout=60)
            hit = wait_until(lambda: self._prefetched(request), timeout=60, what="the prefetch")
            chunks = int(hit[0])
            if chunks == 0:
                return 0, None
            got = self.transfer.retrieve(self.key(tokens[: chunks * CHUNK], request, 0), self.instance_id)
            return chunks, got
        finally:
            self.requests.end_session(request).result(timeout=60)

    def _prefetched(self, request: str) -> tuple[int] | None:
        chunks = self.requests.query_prefetch_status(request).result(timeout=60)
        return None if chunks is None else (chunks,)

    def close(self) -> None:
        self.requests.close()
        self._zmq.term()


def test_two_lmcache_servers_share_kv_through_kvstore(lmcache_servers):
    import torch

    meta, ((port_a, _), (port_b, http_b)) = lmcache_servers
    tokens = list(range(1000, 1000 + 4 * CHUNK))
    kv = (torch.randn((2, LAYERS, len(tokens), HEADS * HEAD_DIM), generator=torch.Generator().manual_seed(7))).half()
    writer = Worker(port_a)
    try:
        assert writer.store(tokens, kv)
    finally:
        writer.close()
    chunk_bytes = kv[:, :, :CHUNK].numel() * kv.element_size()
    with KVClient(meta) as client:  # LMCache's store controller writes L1 to L2 in the background
        wait_until(lambda: client.stats().keys == 4, timeout=60, what="4 chunks in kvstore")
        stored = list(client.iter_keys("lmcache/"))
        assert len(stored) == 4 and all(k.startswith(f"lmcache/{MODEL}@") for k in stored)
        assert {info.size for info in client.describe(stored)} == {chunk_bytes}

    reader = Worker(port_b)  # another host: its L1 is empty
    try:
        chunks, got = reader.retrieve(tokens + list(range(5000, 5000 + CHUNK)))  # and a chunk never stored
        assert chunks == 4
        assert got is not None and torch.equal(got, kv)
        missing, nothing = reader.retrieve(list(range(7000, 7000 + 2 * CHUNK)))
        assert missing == 0 and nothing is None
    finally:
        reader.close()
    wait_until(lambda: l2_status(http_b)["leases_released"] == 4, timeout=30, what="the read leases handed back")
    assert l2_status(http_b)["leases_held"] == 0 and l2_status(http_b)["failed_keys"] == 0
