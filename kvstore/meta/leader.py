"""Leader election through a Redis lease, for two or more metadata services on one Redis.

Acquire (a Lua script): only if no leader key exists, increment the epoch and write the leader
key (address, epoch, a random owner token) with the lease TTL. Renew and release compare the
owner token first. The leader holds its role only while its lease is valid by its own monotonic
clock (renewed at least every `renew_s`, trusted for `ttl_s` minus a margin after each renewal
was sent), so a paused leader that wakes knows it is no longer one before it answers; and every
write it makes is fenced by its epoch (redisdb.py), so it can never change the records either.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvstore.metaclient.rediskeys import Keys

log = logging.getLogger(__name__)

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local epoch = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'addr', ARGV[1], 'epoch', epoch, 'token', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return epoch
"""
_RENEW = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_MARGIN = 0.2  # share of the lease a leader does not count on (renewals in flight, clock drift)


class Role(str, Enum):
    LEADER = "leader"
    STANDBY = "standby"


@dataclass(frozen=True)
class View:
    """What this service knows of the election."""

    role: Role
    epoch: int
    leader: str  # the leader's address ("" while none)


class Leadership:
    """Runs the election in a thread. `on_elected(epoch, token)` runs in a thread of its own when
    this service takes the lease (it loads the records, then serves; `token` is this lease's, which
    fences its writes); `on_deposed()` when it loses it."""

    def __init__(
        self,
        client: Any,
        keys: Keys,
        address: str,
        ttl_s: float,
        renew_s: float,
        on_elected: Callable[[int, str], None],
        on_deposed: Callable[[], None],
    ) -> None:
        self._client = client
        self._keys = keys
        self.address = address
        self._ttl_ms = int(ttl_s * 1000)
        self._ttl_s = ttl_s
        self._renew_s = renew_s
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._token = secrets.token_hex(16)
        self._view = View(Role.STANDBY, 0, "")
        self._valid_until = 0.0  # monotonic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="meta-leader", daemon=True)
        self.redis_error = ""  # the last Redis failure seen, "" while it answers

    def start(self) -> Leadership:
        self._thread.start()
        return self

    @property
    def view(self) -> View:
        return self._view

    def lease_end(self) -> float:
        """When this service's lease ends, in wall-clock seconds (in the past unless it leads)."""
        return time.time() + (self._valid_until - time.monotonic())

    def leads(self) -> bool:
        """Whether this service may act as leader now (its lease is valid by its own clock)."""
        return self._view.role is Role.LEADER and time.monotonic() < self._valid_until

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
                self.redis_error = ""
            except Exception as exc:  # noqa: BLE001 - Redis down: keep the role while the lease is valid
                self.redis_error = f"{type(exc).__name__}: {exc}"
                if self._view.role is Role.LEADER and time.monotonic() >= self._valid_until:
                    self._step_down("the lease ran out while Redis did not answer")
            self._stop.wait(self._renew_s)

    def _step(self) -> None:
        sent = time.monotonic()
        if self._view.role is Role.LEADER:
            if self._renew(keys=[self._keys.leader], args=[self._token, self._ttl_ms]) == 1:
                self._valid_until = sent + self._ttl_s * (1 - _MARGIN)
            else:
                self._step_down("another service holds the lease")
        else:
            self._token = secrets.token_hex(16)  # a fresh one per acquisition: it fences this lease's writes
            epoch = int(
                self._acquire(
                    keys=[self._keys.leader, self._keys.epoch], args=[self.address, self._token, self._ttl_ms]
                )
            )
            if epoch:
                self._valid_until = sent + self._ttl_s * (1 - _MARGIN)
                self._view = View(Role.LEADER, epoch, self.address)
                log.warning("metadata service %s is the leader now (epoch %d)", self.address, epoch)
                # Loading the records may take longer than the lease: this loop keeps renewing.
                threading.Thread(
                    target=self._take_over, args=(epoch, self._token), name="meta-takeover", daemon=True
                ).start()
        self._announce()

    @property
    def token(self) -> str:
        """The owner token of the lease this service holds (or last tried for)."""
        return self._token

    def _take_over(self, epoch: int, token: str) -> None:
        try:
            self._on_elected(epoch, token)
        except Exception:
            if self._view.role is not Role.LEADER or self._view.epoch != epoch:
                log.warning("taking over as leader (epoch %d) ended with that lease", epoch)
                return  # another epoch's takeover (if any) is its own
            log.exception("taking over as leader (epoch %d) failed; giving the lease back", epoch)
            self._give_up()

    def _announce(self) -> None:
        """Learn the leader's address (for NOT_LEADER answers) and say who we are (for `stat`)."""
        leader = self._client.hgetall(self._keys.leader)
        addr = leader.get(b"addr", b"").decode()
        if self._view.role is Role.STANDBY:
            self._view = View(Role.STANDBY, int(leader.get(b"epoch", b"0")), addr)
        self._client.hset(self._keys.members, self.address, f"{self._view.role.value} {time.time():.0f}")

    def _step_down(self, why: str) -> None:
        log.warning("metadata service %s steps down (epoch %d): %s", self.address, self._view.epoch, why)
        self._view = View(Role.STANDBY, self._view.epoch, "")
        self._valid_until = 0.0
        self._on_deposed()

    def _give_up(self) -> None:
        try:
            self._release(keys=[self._keys.leader], args=[self._token])
        except Exception:  # noqa: BLE001 - it expires anyway
            pass
        self._step_down("gave the lease back")

    def members(self) -> dict[str, str]:
        """Service address -> "role last-seen" of every service that announced itself."""
        return {k.decode(): v.decode() for k, v in self._client.hgetall(self._keys.members).items()}

    def stop(self) -> None:
        """Stop the election and, if leading, give the lease back (a standby takes over at once)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if self._view.role is Role.LEADER:
            self._give_up()
        try:
            self._client.hdel(self._keys.members, self.address)
        except Exception:  # noqa: BLE001 - best effort
            pass
