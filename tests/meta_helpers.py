"""How the meta unit tests act as clients of a MetaStore: a writer that reports what the daemon
would (a receipt per written replica), and a same-host (shm) client whose grants are LOCAL."""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.grant import GrantSigner
from kvstore.meta.store import MetaStore
from kvstore.results import PutStartResult, PutWritten
from kvstore.types import Endpoint, SegmentInfo, Tier

SECRET = b"k" * 16
SIGNER = GrantSigner(SECRET)
HOST = "host-1"  # the daemons' host in these tests; a client passing it reads over shm
ENDPOINTS = (Endpoint("tcp", "127.0.0.1:1"), Endpoint("shm", f"{HOST}|1|/dev/shm/none"))


def endpoint_address(info: SegmentInfo, transport: str) -> str:
    """The address of the segment's `transport` endpoint (the test fails where it has none)."""
    endpoint = info.endpoint(transport)
    assert endpoint is not None, f"segment {info.segment_id} has no {transport} endpoint: {info.endpoints}"
    return endpoint.address


def segment(segment_id: str, daemon: str, tier: Tier, capacity: int) -> SegmentInfo:
    return SegmentInfo(segment_id, daemon, tier, capacity, ENDPOINTS, HOST)


def receipts(result: PutStartResult) -> PutWritten:
    """What a tcp writer hands PutEnd once every replica's daemon took its bytes."""
    return PutWritten(0, tuple(SIGNER.receipt(g) for g in result.grants))


def commit(store: MetaStore, keys: Sequence[str], results: Sequence[PutStartResult], checksum: int = 7) -> None:
    """PutEnd for every key whose PutStart was OK, with the daemons' receipts."""
    ok = [(k, r) for k, r in zip(keys, results, strict=True) if not r.code]
    store.put_end([k for k, _ in ok], [checksum] * len(ok), [receipts(r) for _, r in ok])
