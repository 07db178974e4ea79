"""Where a metadata client sends its calls: one service, a list (a leader and its standbys), or
the leader a Redis lease names (redis://host:port/db?cluster=NAME, and &shard=I for shard I of a
sharded store). Thread safe."""

from __future__ import annotations

import logging
import threading
from urllib.parse import parse_qs, urlsplit

from kvstore.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)


class Targets:
    def __init__(self, spec: str) -> None:
        spec = spec.strip()
        if not spec:
            raise InvalidArgument("no metadata service address: give host:port, a list, or a redis:// URL")
        self._redis_url = ""
        self._cluster = "default"
        self._shard = 0
        self._lock = threading.Lock()
        if spec.startswith(("redis://", "rediss://")):
            url = urlsplit(spec)
            query = parse_qs(url.query)
            self._cluster = query.get("cluster", ["default"])[0]
            try:
                self._shard = int(query.get("shard", ["0"])[0])
            except ValueError:
                raise InvalidArgument(f"{spec}: shard=I needs a shard number") from None
            self._redis_url = url._replace(query="").geturl()
            self._addresses: list[str] = []
            self._current = self._resolve() or ""
        else:
            self._addresses = [a.strip() for a in spec.split(",") if a.strip()]
            self._current = self._addresses[0]

    def for_shard(self, shard: int) -> str:
        """Where shard `shard`'s leader is looked up when this names a Redis lease; "" otherwise
        (the caller then goes to the address the shard map gives)."""
        if not self._redis_url:
            return ""
        return f"{self._redis_url}?cluster={self._cluster}&shard={shard}"

    def __len__(self) -> int:
        return max(1, len(self._addresses))

    @property
    def current(self) -> str:
        with self._lock:
            if not self._current and self._redis_url:
                self._current = self._resolve() or ""
            if not self._current:
                raise Unavailable(f"no metadata service leads in Redis {self._redis_url} (cluster {self._cluster}) now")
            return self._current

    def follow(self, leader: str, refused_by: str) -> bool:
        """A standby at `refused_by` named `leader` ("" while none leads): go there. False if
        there is nowhere new to go."""
        with self._lock:
            if leader and leader != refused_by:
                if self._addresses and leader not in self._addresses:
                    self._addresses.append(leader)
                self._current = leader
                return True
        return self.next_after(refused_by)

    def next_after(self, failed: str) -> bool:
        """`failed` did not answer (or does not lead): move to the next candidate; False if it is
        the only one."""
        with self._lock:
            if self._redis_url:
                found = self._resolve()
                if found and found != failed:
                    self._current = found
                    return True
                return False
            if len(self._addresses) < 2:
                return False
            i = self._addresses.index(failed) if failed in self._addresses else -1
            self._current = self._addresses[(i + 1) % len(self._addresses)]
            return True

    def _resolve(self) -> str | None:
        """The leader's address as the Redis lease says, or None."""
        try:
            from kvstore.metaclient.rediskeys import Keys, connect

            client = connect(self._redis_url)
            try:
                found = client.hget(Keys.of_shard(self._cluster, self._shard).leader, "addr")
            finally:
                client.close()
        except Unavailable as exc:
            log.warning("looking up the metadata leader: %s", exc)
            return None
        return found.decode() if found else None
