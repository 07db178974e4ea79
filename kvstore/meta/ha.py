"""Which MetaStore answers a call: the one store of an in-memory service, or, on Redis, the store
of the elected leader.

On Redis (Replicated): a standby answers every call but ServiceInfo and Stats with NotLeader,
naming the leader. The leader builds its store when it wins the lease: it loads the records
(kvstore.meta.recovery), then serves reads at once (of replicas its daemons confirmed) and
writes once the previous leader's grants have expired (at once if there was none). Its writes go
through a group-commit journal fenced by its epoch. If Redis stops answering, changes fail
(Unavailable) and reads go on while the lease is valid by the leader's own clock; past it the
leader answers nothing (no reply, grant or heartbeat), and every grant it signs expires no later
than its lease's end plus a grant lifetime. When Redis answers again, the leader rebuilds its
store from the records (what failed to be written was never acknowledged), still under its lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from kvstore.clock import Clock
from kvstore.config import MetaConfig
from kvstore.errors import InvalidArgument, NotLeader, Unavailable
from kvstore.grant import GrantSigner
from kvstore.meta.journal import GroupCommit
from kvstore.meta.leader import Leadership, Role
from kvstore.meta.redisdb import RedisRecords, check_schema
from kvstore.meta.store import MetaStore
from kvstore.metaclient.rediskeys import Keys, connect
from kvstore.shards import ShardSpec

log = logging.getLogger(__name__)


class Standing(NamedTuple):
    """What a service says of itself (ServiceInfo, Stats)."""

    role: str  # "leader", "standby", or "" (in memory)
    epoch: int
    leader: str
    standbys: tuple[str, ...] = ()
    redis: str = ""  # "ok", or why not; "" in memory
    reconciling: int = 0  # segments loaded after a takeover and not yet mounted again
    writes_open: bool = True


class Stores(Protocol):
    def for_reads(self) -> MetaStore:
        """The store to answer a call that changes nothing durable; NotLeader / Unavailable."""

    def for_writes(self) -> MetaStore:
        """The store to answer a call that changes records; NotLeader / Unavailable."""

    def standing(self) -> Standing: ...

    def current(self) -> MetaStore | None:
        """The store this service holds now (for upkeep), None on a standby."""

    def still_answering(self) -> None:
        """Raise Unavailable if the role that a call was answered under ended meanwhile (its reply
        must not be sent: a leader past its lease may already have a successor)."""

    def stop(self) -> None: ...


class Single:
    """An in-memory service: one store, no election."""

    def __init__(self, store: MetaStore) -> None:
        self.store = store

    def for_reads(self) -> MetaStore:
        return self.store

    def for_writes(self) -> MetaStore:
        return self.store

    def current(self) -> MetaStore | None:
        return self.store

    def still_answering(self) -> None:
        pass

    def standing(self) -> Standing:
        return Standing("", 0, "", writes_open=True)

    def stop(self) -> None:
        pass


class Replicated:
    """Leader and standbys on one Redis."""

    def __init__(
        self, config: MetaConfig, signer: GrantSigner, address: str, clock: Clock, make: Callable[..., MetaStore]
    ) -> None:
        self.config = config
        self._signer = signer
        self._clock = clock
        self._make = make
        self._client = connect(config.redis_url)
        keys = Keys.of_shard(config.cluster, ShardSpec.parse(config.shard).index)
        check_schema(self._client, keys, config.cluster)
        self.records = RedisRecords(self._client, keys, config.durability)
        self.durability_gap = self.records.durability_gap()
        if self.durability_gap and not config.durability_unchecked:
            raise InvalidArgument(
                f"durability {config.durability} cannot be kept on Redis {config.redis_url}: {self.durability_gap}; "
                "configure Redis to keep it (docs/ha.md), choose the durability it gives, or run anyway with "
                "--durability-unchecked (stat and /metrics then say so)"
            )
        if self.durability_gap:
            log.error("durability %s is NOT kept (run with durability_unchecked): %s", config.durability,
                      self.durability_gap)  # fmt: skip
        self._store: MetaStore | None = None
        self._lock = threading.Lock()
        self.leadership = Leadership(
            self._client, keys, address, config.leader_ttl_s, config.leader_renew_s, self._elected, self._deposed
        )

    @property
    def redis(self) -> Any:
        """The Redis client the records and the election use."""
        return self._client

    def start(self) -> Replicated:
        self.leadership.start()
        return self

    def _elected(self, epoch: int, token: str) -> None:
        journal = GroupCommit(self.records.writer(epoch, token), f"Redis {self.config.redis_url}")
        store = self._make(journal=journal, grant_ceiling=self._grant_ceiling)
        records = self.records
        report = store.restore(
            records.load_segments(),
            records.load_objects(),
            records.load_pins(),
            records.load_tenants(),
            first=epoch == 1,  # no leader before this one: no grant of another to wait out
            holds=records.load_holds(),
        )
        log.warning(
            "epoch %d: loaded %d segments and %d objects (%d replicas, %d objects dropped); reads and writes open; "
            "%d bytes the old leader held come back in %.1f s",
            epoch,
            report.segments,
            report.objects,
            report.replicas_dropped,
            report.objects_dropped,
            report.held,
            store.takeover_wait_s(),
        )
        with self._lock:
            # A load that outlived its election (the lease lost, or taken again at another epoch
            # meanwhile) is never served: its records may be older than a successor's changes.
            if self.leadership.view.epoch != epoch or not self.leadership.leads():
                raise Unavailable(f"the lease of epoch {epoch} ended while its records were loading")
            self._store = store

    def _deposed(self) -> None:
        with self._lock:
            self._store = None

    def _grant_ceiling(self) -> float:
        """The latest expiry (wall-clock seconds, as daemons check grants) a grant signed now may
        carry: the lease's end plus the longest grant lifetime. A successor is elected no sooner
        than this lease's end and hands out space this leader held, or frees, only a grant lifetime
        (plus the grace) later, so no grant of this leader, even one signed by a call that stalled
        past the lease, reaches space handed to another key."""
        return self.leadership.lease_end() + max(self.config.lease_ttl_s, self.config.write_grant_ttl_s)

    def _leader_store(self, writes: bool) -> MetaStore:
        view = self.leadership.view
        if view.role is not Role.LEADER:
            raise NotLeader(
                f"this metadata service ({self.leadership.address}) is a standby; the leader is "
                f"{view.leader or 'being elected'}",
                view.leader,
            )
        # Past its lease a leader answers nothing, reads and heartbeats included: it cannot know
        # that no successor was elected meanwhile (a partition from Redis looks like Redis down).
        if not self.leadership.leads():
            raise Unavailable("the leader's lease is being renewed: retry")
        with self._lock:
            store = self._store
        if store is None:
            raise Unavailable("this metadata service is taking over as leader (loading the index): retry")
        return store

    def for_reads(self) -> MetaStore:
        return self._leader_store(writes=False)

    def for_writes(self) -> MetaStore:
        store = self._leader_store(writes=True)
        if not store.writes_open() and not self.leadership.redis_error:  # its journal failed
            try:
                self._rebuild(store)  # Redis is back: start again from what it holds
            except Exception as exc:  # it was not back after all (the election had not seen it yet)
                raise Unavailable(f"Redis does not answer ({exc}): changes are refused until it is back") from exc
            store = self._leader_store(writes=True)
        return store

    def _rebuild(self, failed: MetaStore) -> None:
        """Load the index again in place of `failed`, whose journal failed. No store serves while
        it loads (a change made meanwhile could miss the load); if the load fails, `failed` serves
        reads again and the next write tries once more."""
        with self._lock:
            if self._store is not failed:  # another caller rebuilt it, or is rebuilding it now
                return
            self._store = None
        log.warning("Redis answers again: rebuilding the index from its records")
        try:
            self._elected(self.leadership.view.epoch, self.leadership.token)
        except BaseException:
            with self._lock:
                if self._store is None:
                    self._store = failed
            raise

    def current(self) -> MetaStore | None:
        with self._lock:
            return self._store

    def still_answering(self) -> None:
        if self.leadership.view.role is Role.LEADER and not self.leadership.leads():
            raise Unavailable("the leader's lease ended while it answered: retry")

    def standing(self) -> Standing:
        view = self.leadership.view
        try:
            members = self.leadership.members()
        except Exception:  # noqa: BLE001 - Redis down: say so
            members = {}
        store = self.current()
        standbys = tuple(sorted(a for a, v in members.items() if v.startswith("standby") and a != view.leader))
        return Standing(
            view.role.value,
            view.epoch,
            view.leader,
            standbys,
            (self.leadership.redis_error or "ok") + self._unchecked(),
            store.reconciling if store else 0,
            store is not None and store.writes_open(),
        )

    def _unchecked(self) -> str:
        gap = self.durability_gap
        return f"; durability {self.config.durability} UNCHECKED: {gap}" if gap else ""

    def stop(self) -> None:
        self.leadership.stop()
