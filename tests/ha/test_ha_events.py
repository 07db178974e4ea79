"""KV events across a failover on a real redis-server: the standby that takes over opens a new
epoch (AllBlocksCleared, seq = epoch) and then publishes every block it loaded from Redis, so a
consumer that followed it as a standby relearns the store from its own stream."""

from __future__ import annotations

import re

import zmq

from kvstore.client import KVClient
from kvstore.events import wire
from tests.cluster import wait_until
from tests.ha.conftest import FAST, meta_on
from tests.ha.test_ha import leader_of, value, writes_open

EVENTS = {"KVSTORE_META_EVENTS_PORT": "0", "KVSTORE_LOG_LEVEL": "INFO"}
LINE = re.compile(r"KV events: epoch (\d+) on (tcp://\S+)")


def epochs(proc) -> list[tuple[int, str]]:
    return [(int(e), endpoint) for e, endpoint in LINE.findall("".join(proc.lines))]


def test_the_standby_that_takes_over_opens_a_new_epoch_with_the_loaded_blocks(ha, redis):
    a, addr_a, _ = meta_on(ha, redis, env=EVENTS)
    wait_until(lambda: leader_of(addr_a), timeout=30, what="a leader")
    b, addr_b, _ = meta_on(ha, redis, env=EVENTS)
    ha.daemon(f"{addr_a},{addr_b}", "64MiB", FAST)
    [(standby_epoch, endpoint)] = epochs(b)  # a standby publishes an epoch with nothing in it
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    received: list[tuple[int, wire.Batch]] = []

    def receive() -> list[tuple[int, wire.Batch]]:
        while sub.poll(10):
            _, seq, payload = sub.recv_multipart()
            received.append((wire.seq_of(seq), wire.decode_batch(payload)))
        return received

    keys = [f"ev/{i}" for i in range(20)]
    try:
        wait_until(lambda: writes_open(addr_a), timeout=30, what="writes open")
        with KVClient(addr_a) as client:
            client.put_many(keys, [value(k) for k in keys])
        a.kill()
        wait_until(lambda: len(epochs(b)) == 2, timeout=60, what="the standby's takeover epoch")
        epoch = epochs(b)[1][0]
        assert epoch > standby_epoch

        def stored() -> set[str | None]:
            return {
                e.object_key for s, batch in receive() if s >= epoch for e in batch.events if isinstance(e, wire.Stored)
            }

        wait_until(lambda: set(keys) <= stored(), timeout=60, what="the loaded blocks in the new epoch")
        opened = [batch for s, batch in received if s == epoch]
        assert opened and opened[0].events == [wire.Cleared()]
        assert all(s < epoch for s, _ in received[: received.index((epoch, opened[0]))])
    finally:
        sub.close(0)
