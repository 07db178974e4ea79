"""The service's side of regions: runs of one DRAM segment reserved for one same-host writer, which
it fills with many small values and commits one by one, so a put is one call (PutCommit)
instead of two (PutStart + PutEnd). Under the store's lock.

A region is allocated whole and counts as used. A committed piece becomes a COMPLETE key at once
(its space is the key's from then on, freed with it); what was not committed is the region's
gaps, freed when the writer releases the region, or once its grant (LOCAL, so only the writer's
own shm mapping applies it) has expired and the grace has passed. Pieces are checked to lie in
the region and not to overlap each other, so no two keys ever share bytes.

Regions are not journaled, like puts in progress: a service that takes over waits out every
grant the old one signed before it allocates, and knows none of its regions (their commits
come back KEY_NOT_FOUND, and the writer puts those keys again). A reservation is answered only
once every change made before it is durable, as a PutStart is: space freed by a removal or an
eviction still being written is never handed to a region before that removal is in the journal.
Region ids come from the OS generator (`secrets`): one writer cannot predict another's.
"""

from __future__ import annotations

import bisect
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from kvstore.clock import Clock
from kvstore.config import MetaConfig
from kvstore.errors import ErrorCode, InvalidArgument
from kvstore.grant import LOCAL, GrantSigner
from kvstore.meta import entry
from kvstore.meta.gate import WriteGate
from kvstore.meta.index import ObjectState
from kvstore.meta.segments import Segment, pack_location
from kvstore.meta.state import MetaState
from kvstore.meta.tenants import DEFAULT_ID
from kvstore.results import OK, KeyResult, Reserved
from kvstore.types import GrantMode, Tier, validate_keys

MAX_REGION_BYTES = 64 << 20
T = TypeVar("T")


class Sliced(Protocol):
    """MetaStore._sliced: work(indices, now) per slice under the lock; with `changes`, returns
    once what the slices changed, and everything submitted before, is durable."""

    def __call__(self, n: int, work: Callable[[range, float], list[T]], changes: bool = ..., /) -> list[T]: ...


@dataclass
class Region:
    region_id: int
    holder: str
    segment: Segment
    start: int
    length: int
    until: float  # wall clock: the region's grant expires
    offsets: list[int] = field(default_factory=list)  # committed pieces, sorted
    sizes: dict[int, int] = field(default_factory=dict)  # offset -> aligned size

    def take(self, offset: int, size: int) -> bool:
        """Commit the piece [offset, offset + size) if it lies inside the region and overlaps no
        committed piece; False (and nothing changes) if not."""
        if offset < self.start or offset + size > self.start + self.length:
            return False
        offsets = self.offsets
        i = bisect.bisect_left(offsets, offset)
        if i < len(offsets) and offsets[i] < offset + size:
            return False
        if i > 0 and offsets[i - 1] + self.sizes[offsets[i - 1]] > offset:
            return False
        offsets.insert(i, offset)
        self.sizes[offset] = size
        return True

    def gaps(self) -> Iterator[tuple[int, int]]:
        """(offset, size) of the space no piece took."""
        at = self.start
        for offset in self.offsets:
            if offset > at:
                yield at, offset - at
            at = offset + self.sizes[offset]
        if at < self.start + self.length:
            yield at, self.start + self.length - at


class Regions:
    def __init__(self, config: MetaConfig, state: MetaState, signer: GrantSigner) -> None:
        self.config = config
        self._st = state
        self._signer = signer
        self._regions: dict[int, Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def reserve(self, holder: str, client_host: str, size: int, now: float, tenant: int = DEFAULT_ID) -> Reserved:
        """A region of `size` bytes in the emptiest DRAM segment on `client_host`; NO_SPACE if
        none has room now (nothing is evicted for a region: the writer's PutStart does that).
        None for a tenant with a DRAM quota: commits are not checked against it, PutStart is."""
        st = self._st
        if not holder or not 0 < size <= MAX_REGION_BYTES:
            return Reserved(ErrorCode.INVALID_ARGUMENT, f"a region needs a client id and 1 to {MAX_REGION_BYTES} bytes")
        limits = st.tenants.by_id(tenant)
        if limits is not None and limits.quotas.get(Tier.DRAM) is not None:
            return Reserved(ErrorCode.UNAVAILABLE, "this tenant has a DRAM quota: no regions, puts use PutStart")
        if st.usage(Tier.GPU)[1]:
            return Reserved(ErrorCode.UNAVAILABLE, "puts land on the GPU tier first here: no regions")
        local = [s for s in st.segments.usable(Tier.DRAM) if s.local_to(client_host)]
        if not local:
            return Reserved(ErrorCode.UNAVAILABLE, "no DRAM segment on the client's host: no regions")
        for seg in sorted(local, key=lambda s: -s.allocator.free_bytes):
            if st.segments.is_suspect(seg.daemon_id, now):
                continue
            length = seg.allocator.aligned(size)
            offset = seg.allocator.allocate(length)
            if offset is None:
                continue
            region_id = secrets.randbits(63) or 1
            while region_id in self._regions:
                region_id = secrets.randbits(63) or 1
            until = now + self.config.write_grant_ttl_s
            st.segments.holds.region(pack_location(seg.number, offset), length)  # journaled before it is answered
            region = self._regions[region_id] = Region(region_id, holder, seg, offset, length, until)
            grant = self._signer.sign(seg.segment_id, offset, length, GrantMode.WRITE, int(until * 1000), LOCAL)
            return Reserved(
                region_id=region.region_id, grant=grant, segment=seg.info, alignment=seg.allocator.alignment
            )
        return Reserved(ErrorCode.NO_SPACE, "no room for a region on this host now")

    def commit(
        self,
        holder: str,
        region_id: int,
        keys: Sequence[str],
        offsets: Sequence[int],
        sizes: Sequence[int],
        checksums: Sequence[int],
        part: range,
        now: float,
    ) -> list[KeyResult]:
        """Make the `sizes[i]` bytes at `offsets[i]` of the region COMPLETE as `keys[i]`, for each
        i in `part` (the region is looked up once: the caller holds the store's lock)."""
        region = self._regions.get(region_id)
        if region is not None and not self._st.segments.has_number(region.segment.number):
            del self._regions[region_id]  # its segment went away, and its space with it
            region = None
        if region is None or region.holder != holder or now > region.until + self._st.quarantine.grace:
            return [
                KeyResult(
                    ErrorCode.KEY_NOT_FOUND,
                    f"region {region_id} is not held (expired or released): put {keys[i]!r} again",
                )
                for i in part
            ]
        index, number = self._st.index, region.segment.number
        stored: list[str] = []
        locations: list[int] = []
        stored_sizes: list[int] = []
        alignment, aligned_of = region.segment.allocator.alignment, region.segment.allocator.aligned
        results: list[KeyResult] = []
        for i in part:
            key, offset, size = keys[i], offsets[i], sizes[i]
            state = index.state(key)  # first: a commit repeated (its answer lost) finds its own piece taken
            if state is ObjectState.COMPLETE:
                results.append(KeyResult(ErrorCode.ALREADY_EXISTS, f"{key!r} is already stored"))
                continue
            if state is ObjectState.PENDING:
                results.append(KeyResult(ErrorCode.KEY_BUSY, f"another put of {key!r} is in progress"))
                continue
            if size <= 0 or offset % alignment or not region.take(offset, aligned_of(size)):
                results.append(
                    KeyResult(
                        ErrorCode.INVALID_ARGUMENT,
                        f"[{offset}, +{size}) is not a free, aligned piece of region {region_id}",
                    )
                )
                continue
            location = pack_location(number, offset)
            index.insert_one(key, location, size, checksums[i])
            stored.append(key)
            locations.append(location)
            stored_sizes.append(size)
            results.append(OK)
        self._st.gained(stored, locations, stored_sizes, region.segment.info.tier)
        return results

    def release(self, holder: str, region_ids: list[int]) -> None:
        """The writer is done with these regions: their gaps are free (it writes there no more)."""
        for region_id in region_ids:
            region = self._regions.get(region_id)
            if region is not None and region.holder == holder:
                self._end(region)

    def expire(self, now: float) -> None:
        """Free the gaps of regions whose grant ran out, the grace included."""
        grace = self._st.quarantine.grace
        for region in [r for r in self._regions.values() if r.until + grace < now]:
            self._end(region)

    def spans(self) -> Iterator[tuple[int, int]]:
        """(location, size) of every region's uncommitted space, for invariant checks."""
        for region in self._regions.values():
            if not self._st.segments.has_number(region.segment.number):
                continue  # the segment went away, and its space with it
            for offset, size in region.gaps():
                yield pack_location(region.segment.number, offset), size

    def _end(self, region: Region) -> None:
        del self._regions[region.region_id]
        if not self._st.segments.has_number(region.segment.number):
            return
        self._st.segments.holds.region_ended(pack_location(region.segment.number, region.start))
        for offset, size in region.gaps():
            region.segment.allocator.free(offset, size)


class RegionCalls:
    """Reserve and PutCommit as MetaStore's calls (`store.regions`): the gate is checked, the lock
    taken, and both worked through in the store's journaled slices."""

    def __init__(
        self,
        regions: Regions,
        lock: threading.RLock,
        gate: WriteGate,
        clock: Clock,
        sliced: Sliced,
    ) -> None:
        self.regions = regions
        self._lock = lock
        self._gate = gate
        self._clock = clock
        self._sliced = sliced

    def reserve(self, client_id: str, client_host: str, size: int, tenant: int = DEFAULT_ID) -> Reserved:
        """A region for one same-host writer's small values; space is taken, nothing evicted.
        Answered once every earlier change is durable: the space may be a removed key's."""
        self._gate.check()
        reserve = self.regions.reserve

        def work(part: range, now: float) -> list[Reserved]:
            return [reserve(client_id, client_host, size, now, tenant)]

        [reserved] = self._sliced(1, work, True)
        return reserved

    def put_commit(
        self,
        client_id: str,
        region_id: int,
        keys: Sequence[str],
        offsets: Sequence[int],
        sizes: Sequence[int],
        checksums: Sequence[int],
        released: Sequence[int] = (),
    ) -> list[KeyResult]:
        """Values written into a region become COMPLETE (journaled before this returns);
        `released`: regions the writer is done with, their gaps freed first."""
        validate_keys(keys, internal=True)
        if not len(keys) == len(offsets) == len(sizes) == len(checksums):
            raise InvalidArgument(f"{len(keys)} keys need as many offsets, sizes and checksums")
        entry.check_checksums(checksums)
        self._gate.check()
        with self._lock:
            self.regions.release(client_id, list(released))
        commit = self.regions.commit

        def work(part: range, now: float) -> list[KeyResult]:
            return commit(client_id, region_id, keys, offsets, sizes, checksums, part, now)

        return self._sliced(len(keys), work, True)
