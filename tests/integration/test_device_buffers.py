"""Tensors staged through host memory (kvstore.client.staging), against real clusters: from the
DRAM and SSD tiers, over shm and tcp, in chunks, with misses, short buffers and corruption.

Each case runs twice: with CUDA tensors (marked gpu: skipped without a device) and with CPU
tensors forced through the very same staging path (`HostStaging(stage_cpu=True)`), so everything
but the device copies themselves is exercised on any host.
"""

import uuid

import numpy as np
import pytest

from kvstore.client import KVClient
from kvstore.client.staging import HostStaging
from kvstore.config import ClientConfig
from kvstore.errors import ChecksumMismatch, InvalidArgument, KeyNotFound
from kvstore.wire.calls import Get
from tests.cluster import Cluster, wait_until
from tests.conformance.conftest import ALL_ON_SSD

torch = pytest.importorskip("torch")

STAGING = 96 << 10  # small, so a batch of 40 KiB values runs in several chunks


@pytest.fixture(scope="module", params=["dram", "ssd"])
def tier(request):
    return request.param


@pytest.fixture(scope="module")
def address(tier, tmp_path_factory):
    c = Cluster()
    if tier == "dram":
        _, addr = c.meta()
        c.daemon(addr, "64MiB", None, "--segment-size", "64MiB")
    else:
        _, addr = c.meta(ALL_ON_SSD)
        c.daemon(
            addr,
            "64MiB",
            None,
            "--segment-size",
            "64MiB",
            "--ssd-dir",
            str(tmp_path_factory.mktemp("ssd")),
            "--ssd",
            "256MiB",
        )
    yield addr
    c.close()


@pytest.fixture(params=["staged-cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return request.param


@pytest.fixture(params=["shm", "tcp"])
def client(request, address, device):
    staging = HostStaging(STAGING, stage_cpu=device == "staged-cpu")
    with KVClient(address, ClientConfig(transports=(request.param,), timeout_s=20), staging=staging) as c:
        yield c


@pytest.fixture
def settle(tier):
    def wait(client: KVClient) -> None:
        if tier == "ssd":  # blocks, not bytes: a shm writer's region keeps its DRAM reserved until it lapses
            wait_until(
                lambda: next(t.blocks for t in client.stats().tiers if t.tier.value == "dram") == 0,
                what="every block to be demoted to SSD",
            )

    return wait


def on(device: str, t):
    return t.to("cuda") if device == "cuda" else t


def values(seed: int, n: int, shape=(40, 512)):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(torch.bfloat16) for _ in range(n)]


def ns() -> str:
    return uuid.uuid4().hex[:8]


def test_tensors_round_trip_in_chunks(client, device, settle):
    keys = [f"{ns()}/t{i}" for i in range(7)]  # 7 x 40 KiB through 96 KiB at a time
    src = values(1, len(keys))
    assert client.put_many(keys, [on(device, t) for t in src]) == [True] * len(keys)
    settle(client)
    out = [on(device, torch.zeros_like(t)) for t in src]
    assert client.get_many_into(keys, out) == [t.numel() * 2 for t in src]
    for got, want in zip(out, src):
        assert torch.equal(got.cpu(), want)
    assert client.get(keys[0]) == src[0].view(torch.uint8).numpy().tobytes()  # host readers see the same bytes


def test_mixed_host_and_device_buffers_in_one_call(client, device):
    keys = [f"{ns()}/m{i}" for i in range(4)]
    src = values(2, 4)
    client.put_many(keys, [on(device, src[0]), src[1].view(torch.uint8).numpy(), on(device, src[2]), src[3]])
    out = [
        on(device, torch.zeros_like(src[0])),
        bytearray(src[1].numel() * 2),
        np.zeros(src[2].numel() * 2, np.uint8),
        on(device, torch.zeros_like(src[3])),
    ]
    client.get_many_into(keys, out)
    assert torch.equal(out[0].cpu(), src[0]) and torch.equal(out[3].cpu(), src[3])
    assert bytes(out[1]) == src[1].view(torch.uint8).numpy().tobytes()
    assert out[2].tobytes() == src[2].view(torch.uint8).numpy().tobytes()


def test_a_value_larger_than_staging_is_staged_whole(client, device):
    key = f"{ns()}/big"
    [src] = values(3, 1, shape=(1024, 1024))  # 2 MiB >> 96 KiB
    client.put(key, on(device, src))
    out = on(device, torch.empty_like(src))
    assert client.get_into(key, out) == 2 << 20
    assert torch.equal(out.cpu(), src)


def test_misses_and_short_buffers_leave_tensors_untouched(client, device):
    key = f"{ns()}/present"
    [src] = values(4, 1)
    client.put(key, on(device, src))
    sentinel = torch.full_like(src, 7.0)
    miss, short = on(device, sentinel.clone()), on(device, torch.zeros(10, dtype=torch.bfloat16))
    hit = on(device, torch.zeros_like(src))
    results = client.get_many_into([f"{ns()}/absent", key, key], [miss, hit, short], strict=False)
    assert isinstance(results[0], KeyNotFound) and results[1] == src.numel() * 2
    assert isinstance(results[2], InvalidArgument)
    assert torch.equal(miss.cpu(), sentinel) and torch.equal(hit.cpu(), src) and not short.cpu().any()
    with pytest.raises(KeyNotFound):
        client.get_many_into([key, f"{ns()}/absent"], [on(device, torch.zeros_like(src)), miss])


def test_bad_tensors_are_refused_with_the_fix(client, device):
    t = on(device, torch.zeros(64, 64))
    with pytest.raises(InvalidArgument, match="contiguous"):
        client.put(f"{ns()}/nc", t.t())
    with pytest.raises(InvalidArgument, match="empty"):
        client.put(f"{ns()}/empty", on(device, torch.zeros(0)))


def test_corrupt_bytes_never_reach_the_tensor(client, device, settle):
    key = f"{ns()}/corrupt"
    [src] = values(5, 1)
    client.put(key, on(device, src))
    settle(client)
    reply = client.meta.call(Get([key]))
    grant = reply.results[0].grants[0]
    path = reply.segments[grant.segment_id].endpoint("shm").address.split("|")[-1]
    with open(path, "r+b") as fh:
        fh.seek(grant.offset + 9)
        byte = fh.read(1)
        fh.seek(grant.offset + 9)
        fh.write(bytes([byte[0] ^ 0xFF]))
    out = on(device, torch.full_like(src, 3.0))
    [result] = client.get_many_into([key], [out], strict=False)
    assert isinstance(result, ChecksumMismatch)
    assert torch.equal(out.cpu(), torch.full_like(src, 3.0))


def test_staging_limit_is_validated():
    with pytest.raises(InvalidArgument, match="staging_bytes"):
        HostStaging(0)
    with pytest.raises(InvalidArgument, match="staging_bytes"):
        ClientConfig(staging_bytes=0)
