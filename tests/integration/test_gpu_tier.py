"""The GPU tier across real processes: tensors and host buffers to and from GPU segments, demotion
to DRAM and promotion back, eviction past the watermark, corruption, and a daemon restart.

Each case runs on a CUDA device where one is (marked gpu), and everywhere on the GPU segment's
host-memory stand-in (KVSTORE_DAEMON_GPU_DEVICE=-1), with the client staging CPU tensors through
the same path it stages CUDA ones (HostStaging(stage_cpu=True)).
"""

import uuid

import numpy as np
import pytest

from kvstore.client import KVClient
from kvstore.client.staging import HostStaging
from kvstore.config import ClientConfig, DaemonConfig
from kvstore.errors import ChecksumMismatch, KeyNotFound
from kvstore.storage.gpu import GpuSegment
from kvstore.types import Tier
from kvstore.wire.calls import Get
from tests.cluster import SECRET, wait_until

torch = pytest.importorskip("torch")

MIB = 1 << 20
FAST = {
    "KVSTORE_META_TICK_INTERVAL_S": "0.05",
    "KVSTORE_META_HIGH_WATERMARK": "0.8",
    "KVSTORE_META_LOW_WATERMARK": "0.6",
    "KVSTORE_META_PROMOTE_AFTER_HITS": "2",
    "KVSTORE_META_LEASE_TTL_S": "1",
    "KVSTORE_META_SSD_HIGH_WATERMARK": "0.9",
    "KVSTORE_META_SSD_LOW_WATERMARK": "0.8",
}


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.gpu), "host"])
def device(request):
    return request.param


@pytest.fixture
def gpu_env(device):
    return {} if device == "cuda" else {"KVSTORE_DAEMON_GPU_DEVICE": "-1"}


def client_for(address, device, transports=("tcp",)):
    staging = HostStaging(64 * MIB, stage_cpu=device == "host")
    # no location cache: every read is a Get, so the service sees each hit when it happens
    config = ClientConfig(transports=transports, timeout_s=30, location_cache_entries=0)
    return KVClient(address, config, staging=staging)


def start(cluster, gpu_env, gpu="8MiB", dram="32MiB", *extra):
    _, address = cluster.meta(FAST)
    daemon = cluster.daemon(address, dram, gpu_env, "--segment-size", dram, "--gpu", gpu, *extra)
    return address, daemon


def tier_stats(client):
    return {t.tier: t for t in client.stats().tiers}


def settled(client, keys) -> bool:
    """No tier move of `keys` in flight, and every tier at or below the high watermark: nothing is
    left to demote, nor to evict from the bottom tier (the service's tick does that, down to the
    low watermark, so it may land a tick after the GPU got below its own)."""
    if any(info.moving for info in client.describe(keys)):
        return False
    return all(t.used <= 0.8 * t.capacity for t in tier_stats(client).values())


def block(seed: int, size: int = MIB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def tensor_on(device: str, data: np.ndarray):
    t = torch.from_numpy(data.copy())
    return t.to("cuda") if device == "cuda" else t


def test_tensors_and_host_buffers_through_gpu_segments(cluster, gpu_env, device):
    address, _ = start(cluster, gpu_env)
    with client_for(address, device) as c:
        t_src, h_src = block(1, 3 * MIB + 5), block(2, 100_003)
        c.put("t", tensor_on(device, t_src))  # tensor -> GPU segment
        c.put("h", h_src.tobytes())  # host buffer -> GPU segment
        assert tier_stats(c)[Tier.GPU].blocks == 2 and tier_stats(c)[Tier.DRAM].blocks == 0
        out = tensor_on(device, np.zeros(3 * MIB + 5, np.uint8))
        assert c.get_into("t", out) == 3 * MIB + 5  # GPU segment -> tensor
        assert np.array_equal(out.cpu().numpy(), t_src)
        assert c.get("t") == t_src.tobytes()  # GPU segment -> host buffer
        h_out = tensor_on(device, np.zeros(100_003, np.uint8))
        c.get_into("h", h_out)
        assert h_out.cpu().numpy().tobytes() == h_src.tobytes()


def test_demotion_to_dram_and_promotion_back(cluster, gpu_env, device):
    address, _ = start(cluster, gpu_env)
    keys = [f"d/{i}" for i in range(16)]  # 16 MiB through an 8 MiB GPU
    with client_for(address, device) as c:
        for i, k in enumerate(keys):
            c.put(k, tensor_on(device, block(i, MIB - 4096)))
        wait_until(lambda: tier_stats(c)[Tier.GPU].used <= 0.8 * 8 * MIB, what="the GPU below its watermark")
        s = tier_stats(c)
        assert s[Tier.DRAM].demotions > 0 and s[Tier.DRAM].blocks > 0 and c.stats().evictions == 0
        # Demotion stops anywhere between the watermarks and later puts may land above it: where
        # the GPU has no room for one more block below its high watermark, a promotion rightly
        # waits. Make that room by removing the newest blocks that sit on the GPU.
        for info in reversed(c.describe(keys[1:])):
            if tier_stats(c)[Tier.GPU].used + MIB <= 0.8 * 8 * MIB:
                break
            if Tier.GPU in info.tiers:
                assert c.remove_many([info.key], force=True) == [None]
                keys.remove(info.key)
        assert tier_stats(c)[Tier.GPU].used + MIB <= 0.8 * 8 * MIB
        outs = [tensor_on(device, np.zeros(MIB - 4096, np.uint8)) for _ in keys]
        assert c.get_many_into(keys, outs) == [MIB - 4096] * len(keys)  # wherever each block is now
        for k, o in zip(keys, outs):
            assert np.array_equal(o.cpu().numpy(), block(int(k.split("/")[1]), MIB - 4096)), k
        c.get_many_into(keys[:1], outs[:1])  # d/0 went first: read twice, it is hot
        wait_until(lambda: tier_stats(c)[Tier.GPU].promotions >= 1, what="d/0 promoted back to the GPU")
        reply = c.meta.call(Get(keys[:1]))
        assert reply.segments[reply.results[0].grants[0].segment_id].tier is Tier.GPU
        assert c.get(keys[0]) == block(0, MIB - 4096).tobytes()


def test_eviction_past_the_watermark_when_dram_is_full(cluster, gpu_env, device):
    address, _ = start(cluster, gpu_env, "8MiB", "4MiB")
    keys = [f"e/{i}" for i in range(24)]  # 24 MiB through 8 + 4 MiB
    with client_for(address, device) as c:
        for i, k in enumerate(keys):
            c.put(k, tensor_on(device, block(i, MIB // 2)))
            # A block is never evicted while it moves: were puts to outrun the mover, the oldest
            # could be on its way down to DRAM when the service evicts there (it takes newer blocks
            # then), and land once DRAM is back below its watermark, to stay. Each put waits for
            # the tiers to settle, so every eviction finds the oldest blocks where they rest.
            wait_until(lambda: settled(c, keys), what="the GPU and DRAM below their watermarks, no move in flight")
        stats = c.stats()
        assert stats.evictions > 0 and stats.keys + stats.evictions == 24
        outs = [tensor_on(device, np.zeros(MIB // 2, np.uint8)) for _ in keys]
        results = c.get_many_into(keys, outs, strict=False)
        assert isinstance(results[0], KeyNotFound) and results[-1] == MIB // 2  # the oldest went
        for i, (r, o) in enumerate(zip(results, outs)):
            if r == MIB // 2:
                assert np.array_equal(o.cpu().numpy(), block(i, MIB // 2)), keys[i]
            else:
                assert isinstance(r, KeyNotFound) and not o.cpu().numpy().any()


def test_corrupt_gpu_bytes_are_detected(cluster, device):
    from kvstore.daemon.storage_daemon import StorageDaemon

    _, address = cluster.meta(FAST)
    cfg = DaemonConfig(
        meta_address=address,
        secret=SECRET,
        dram_size=16 * MIB,
        segment_size=16 * MIB,
        gpu_size=8 * MIB,
        gpu_device=0 if device == "cuda" else -1,
        transports=("tcp",),
        shm_dir="/dev/shm",
    )
    daemon = StorageDaemon(cfg).start()  # in this process, so the test can reach its GPU memory
    try:
        with client_for(address, device) as c:
            c.put("c", tensor_on(device, block(7, 50_000)))
            reply = c.meta.call(Get(["c"]))
            grant = reply.results[0].grants[0]
            seg = daemon.segment(grant.segment_id)
            assert isinstance(seg, GpuSegment) and seg.tier is Tier.GPU
            seg.memory[grant.offset + 4321] ^= 0xFF
            if device == "cuda":
                torch.cuda.synchronize()  # the daemon reads on its own stream
            out = tensor_on(device, np.full(50_000, 9, np.uint8))
            [result] = c.get_many_into(["c"], [out], strict=False)
            assert isinstance(result, ChecksumMismatch)
            assert (out.cpu().numpy() == 9).all()  # no corrupt byte reached the tensor
    finally:
        daemon.stop()


def test_daemon_restart(cluster, gpu_env, device, tmp_path):
    ssd = ("--ssd-dir", str(tmp_path / "ssd"), "--ssd", "64MiB")
    address, daemon = start(cluster, gpu_env, "4MiB", "8MiB", *ssd)
    keys = [f"r/{uuid.uuid4().hex[:6]}/{i}" for i in range(20)]  # 20 MiB: most reach the SSD
    with client_for(address, device) as c:
        for i, k in enumerate(keys):
            c.put(k, tensor_on(device, block(i, MIB - 4096)))
        wait_until(lambda: tier_stats(c)[Tier.SSD].blocks >= 8, what="blocks demoted down to SSD")
        assert c.exists_many(keys) == [True] * 20
        daemon.stop()  # a clean stop: GPU and DRAM go, SSD stays
        cluster.daemon(address, "8MiB", gpu_env, "--segment-size", "8MiB", "--gpu", "4MiB", *ssd)
        wait_until(
            lambda: len(c.stats().daemons) == 1 and tier_stats(c)[Tier.SSD].blocks > 0,
            what="the restarted daemon to re-announce its SSD blocks",
        )
        survivors = [i for i, e in enumerate(c.exists_many(keys)) if e]
        assert 0 < len(survivors) < len(keys)  # the SSD's blocks, not the GPU's or DRAM's
        outs = [tensor_on(device, np.zeros(MIB - 4096, np.uint8)) for _ in keys]
        results = c.get_many_into(keys, outs, strict=False)
        for i, r in enumerate(results):
            if i in survivors:
                assert np.array_equal(outs[i].cpu().numpy(), block(i, MIB - 4096)), keys[i]
            else:
                assert isinstance(r, KeyNotFound)
        c.put("after", tensor_on(device, block(99, 2 * MIB)))  # the new GPU segment takes puts
        assert tier_stats(c)[Tier.GPU].blocks >= 1
        out = tensor_on(device, np.zeros(2 * MIB, np.uint8))
        c.get_into("after", out)
        assert np.array_equal(out.cpu().numpy(), block(99, 2 * MIB))
