"""A dead or stopped daemon: puts keep committing on the live replicas, reads fall to the live
replica within a replica deadline, and lost replicas are copied again. Keys stay byte-identical."""

from __future__ import annotations

import os
import signal
import time

from kvstore.client import KVClient
from kvstore.config import ClientConfig
from kvstore.wire.calls import Get
from tests.cluster import wait_until

# A daemon silent for 3 s is set aside, and 2 s later dropped: these tests are about dead ones.
FAST_TTL = {"KVSTORE_META_HEARTBEAT_TTL_S": "3", "KVSTORE_META_SILENT_GRACE_S": "2", "KVSTORE_META_SUSPECT_TTL_S": "30"}


def value(i: int, size: int = 64 << 10) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


def replicas(client: KVClient, key: str) -> set[str]:
    got = client.meta.call(Get([key], client_id="probe")).results[0]
    client.meta.call(Get([], released=[got.lease_id], client_id="probe"))
    return {got_segment.split("-")[0] for got_segment in (g.segment_id for g in got.grants)}  # d0-<run>-dram0


def three_daemons(faults, env=FAST_TTL):
    _, meta = faults.meta(env)
    daemons = [faults.daemon(meta, "64MiB", None, "--segment-size", "16MiB", "--daemon-id", f"d{i}") for i in range(3)]
    return meta, daemons


def test_kill9_of_a_daemon_fails_no_replicated_put_and_its_replicas_are_copied_again(faults):
    meta, daemons = three_daemons(faults)
    with KVClient(meta, ClientConfig(replica_num=2)) as client:
        before = [f"before/{i}" for i in range(30)]
        client.put_many(before, [value(i) for i in range(30)])
        daemons[0].kill()  # kill -9: no goodbye
        after = [f"after/{i}" for i in range(60)]
        for i, key in enumerate(after):  # one put at a time: none may fail
            assert client.put(key, value(1000 + i)) is True
        everything = before + after
        expected = [value(i) for i in range(30)] + [value(1000 + i) for i in range(60)]
        assert client.get_many(everything) == expected
        wait_until(  # set aside at once, dropped after its grace: then its keys are short of a replica
            lambda: (
                client.stats().under_replicated == 0 and all(replicas(client, k) == {"d1", "d2"} for k in everything)
            ),
            timeout=60,
            what="the dead daemon dropped and its replicas copied again",
        )
        assert len(client.stats().daemons) == 2
        assert client.get_many(everything) == expected


def test_a_stopped_daemon_costs_one_replica_deadline_not_the_call_deadline(faults):
    meta, daemons = three_daemons(faults)
    config = ClientConfig(replica_num=2, transports=("tcp",), timeout_s=30, replica_timeout_s=1)
    with KVClient(meta, config) as client:
        keys = [f"k/{i}" for i in range(20)]
        client.put_many(keys, [value(i) for i in range(20)])
        stopped = daemons[1]
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            on_stopped = [k for k in keys if "d1" in replicas(client, k)]
            assert on_stopped
            started = time.monotonic()
            assert client.get_many(on_stopped) == [value(keys.index(k)) for k in on_stopped]
            assert time.monotonic() - started < config.timeout_s  # fell to the live replica
            started = time.monotonic()
            for i in range(10):  # puts commit on the others
                assert client.put(f"during/{i}", value(500 + i)) is True
            assert time.monotonic() - started < config.timeout_s
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
        assert client.get_many(keys) == [value(i) for i in range(20)]
        assert client.get_many([f"during/{i}" for i in range(10)]) == [value(500 + i) for i in range(10)]
