"""Tenants: who may call, in which key namespace, within which bytes.

Every key a tenant names is stored under its namespace, `scoped(tenant id, key)`: the default
tenant's (id 0) keys as they are, every other tenant's behind "\\0<id>\\0". Callers' keys may not
hold a NUL (kvstore.types.validate_key), so no key of one tenant can name another's, and the same
key put by two tenants is two objects. Ids are never reused (tenants are not deleted).

A tenant's record (one per tenant, in the journal's `tenants` table) holds its quotas and
reserved bytes per tier, its policy over quota, whether it is offered the transports that do not
check grants per byte range (shm, mooncake), and its tokens: for each token id, the SHA-256 of
the token and when it was made. A token itself is never kept.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from kvstore import tokens
from kvstore.errors import AlreadyExists, InvalidArgument, KeyNotFound
from kvstore.types import Tier

DEFAULT_ID = 0
DEFAULT_NAME = "default"
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
MAX_TOKENS = 64  # per tenant: revoke old ones to make more
_GENERATIONS = itertools.count(1)  # one sequence for the process: no two registries share a value


def scoped(tenant: int, key: str) -> str:
    return key if tenant == DEFAULT_ID else f"\0{tenant}\0{key}"


def namespace(tenant: int) -> str:
    return "" if tenant == DEFAULT_ID else f"\0{tenant}\0"


def tenant_of(key: str) -> int:
    """The tenant a stored key belongs to."""
    if not key.startswith("\0"):
        return DEFAULT_ID
    end = key.find("\0", 1)
    return int(key[1:end]) if end > 1 else DEFAULT_ID


@dataclass(frozen=True)
class Token:
    digest: str
    created: float  # unix seconds
    expires: float = 0.0  # unix seconds; 0: never


@dataclass
class Tenant:
    name: str
    id: int
    quotas: dict[Tier, int] = field(default_factory=dict)  # tier -> most bytes (absent: none)
    reserved: dict[Tier, int] = field(default_factory=dict)  # tier -> bytes others cannot evict
    evict_own: bool = True  # over quota: its own least recently used blocks go first (else refused)
    trust_shm: bool = False  # offered shm and mooncake, which do not check grants per range
    admin: bool = False  # its tokens may also manage tenants and daemons
    tokens: dict[str, Token] = field(default_factory=dict)  # token id -> what is kept of it

    def encode(self) -> bytes:
        return json.dumps(
            {
                "id": self.id,
                "quotas": {t.value: n for t, n in self.quotas.items()},
                "reserved": {t.value: n for t, n in self.reserved.items()},
                "evict_own": self.evict_own,
                "trust_shm": self.trust_shm,
                "admin": self.admin,
                "tokens": {i: [t.digest, t.created, t.expires] for i, t in self.tokens.items()},
            },
            sort_keys=True,
        ).encode()

    @staticmethod
    def decode(name: str, data: bytes) -> Tenant:
        try:
            d = json.loads(data)
            return Tenant(
                name,
                int(d["id"]),
                {Tier(t): int(n) for t, n in d.get("quotas", {}).items()},
                {Tier(t): int(n) for t, n in d.get("reserved", {}).items()},
                bool(d.get("evict_own", True)),
                bool(d.get("trust_shm", False)),
                bool(d.get("admin", False)),
                {
                    i: Token(str(v[0]), float(v[1]), float(v[2]) if len(v) > 2 else 0.0)
                    for i, v in d.get("tokens", {}).items()
                },
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise InvalidArgument(f"the record of tenant {name!r} is not of this schema ({exc})") from None


def default_tenant() -> Tenant:
    """The tenant of `kvstore serve` and of the operator's own token: trusted with shm."""
    return Tenant(DEFAULT_NAME, DEFAULT_ID, trust_shm=True)


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"tenant name {name[:70]!r} is not 1-63 characters of a-z, 0-9, '.', '_', '-' starting with a letter "
            "or digit"
        )
    return name


class TenantRegistry:
    """The tenants, by name and id, and their tokens by id. Changed under the store's lock;
    `lookup` reads it without one (single dict reads).

    `generation` changes, after the change is in place, whenever what a token grants may have:
    a tenant added, loaded or changed, a token made or revoked. It is unique in the process, so
    a registry of another store (a takeover, a rebuild) never has the value of this one: what
    authenticated earlier is still good while the generation it was checked against is current."""

    def __init__(self) -> None:
        self.generation = next(_GENERATIONS)
        self._by_name: dict[str, Tenant] = {}
        self._by_id: dict[int, Tenant] = {}
        self._by_token: dict[str, Tenant] = {}
        self.changed: set[str] = set()  # names whose records the journal has not been handed
        self.usage: Counter[tuple[int, Tier]] = Counter()  # (tenant id, tier) -> bytes held
        self.blocks: Counter[tuple[int, Tier]] = Counter()  # (tenant id, tier) -> replicas held
        self._put(default_tenant())

    def _put(self, tenant: Tenant) -> None:
        old = self._by_name.get(tenant.name)
        for token_id in old.tokens if old else ():
            self._by_token.pop(token_id, None)
        self._by_name[tenant.name] = tenant
        self._by_id[tenant.id] = tenant
        for token_id in tenant.tokens:
            self._by_token[token_id] = tenant
        self.generation = next(_GENERATIONS)

    def load(self, records: dict[str, bytes]) -> None:
        for name, data in records.items():
            self._put(Tenant.decode(name, data))

    def get(self, name: str) -> Tenant:
        tenant = self._by_name.get(name)
        if tenant is None:
            raise KeyNotFound(f"no tenant {name!r}: `kvstore tenant add {name}` makes it")
        return tenant

    def by_id(self, tenant_id: int) -> Tenant | None:
        return self._by_id.get(tenant_id)

    def all(self) -> list[Tenant]:
        return sorted(self._by_name.values(), key=lambda t: t.id)

    @property
    def limited(self) -> bool:
        """Whether any tenant has a quota or a reservation (else placement skips the checks)."""
        return any(t.quotas or t.reserved for t in self._by_id.values())

    def add(self, spec: Tenant, update: bool, keep_id: bool = False) -> Tenant:
        """Make tenant `spec.name` (a fresh id, or with `keep_id` spec.id), or with `update`
        change its settings."""
        check_name(spec.name)
        for what, table in (("quota", spec.quotas), ("reserved", spec.reserved)):
            if any(n < 0 for n in table.values()):
                raise InvalidArgument(f"a {what} cannot be negative")
        old = self._by_name.get(spec.name)
        if old is not None and not update:
            raise AlreadyExists(f"tenant {spec.name!r} exists: pass --update to change it")
        if old is None and update:
            raise KeyNotFound(f"no tenant {spec.name!r} to update")
        tenant_id = old.id if old is not None else max(self._by_id) + 1
        if keep_id and old is None:
            other = self._by_id.get(spec.id)
            if spec.id == 0 or (other is not None and other.name != spec.name):
                raise AlreadyExists(f"tenant id {spec.id} is taken here: the shards' tenants differ (docs/sharding.md)")
            tenant_id = spec.id
        tenant = Tenant(
            spec.name,
            tenant_id,
            dict(spec.quotas),
            dict(spec.reserved),
            spec.evict_own,
            spec.trust_shm,
            spec.admin,
            dict(old.tokens) if old else {},
        )
        self._put(tenant)
        self.changed.add(tenant.name)
        return tenant

    def make_token(self, name: str, now: float, ttl_s: float = 0.0, given: str = "") -> tuple[str, str]:
        """(token id, token): a new bearer token for tenant `name` (shown once, kept hashed),
        good for `ttl_s` (0: until revoked); `given`: that token (made by another shard)."""
        tenant = self.get(name)
        if len(tenant.tokens) >= MAX_TOKENS:
            raise InvalidArgument(f"tenant {name!r} has {MAX_TOKENS} tokens: revoke some first")
        if given:
            token_id, token = tokens.tenant_token_id(given), given
            if not token_id or token_id in self._by_token:
                raise InvalidArgument("that token is not a tenant token, or its id is taken here")
        else:
            token_id, token = tokens.new_tenant_token()
        while token_id in self._by_token:
            token_id, token = tokens.new_tenant_token()
        tenant.tokens[token_id] = Token(tokens.digest(token), now, now + ttl_s if ttl_s > 0 else 0.0)
        self._by_token[token_id] = tenant
        self.generation = next(_GENERATIONS)
        self.changed.add(name)
        return token_id, token

    def revoke(self, name: str, token_id: str = "") -> int:
        """Forget one token of `name` (or every one); how many were revoked."""
        tenant = self.get(name)
        ids = [token_id] if token_id else list(tenant.tokens)
        if token_id and token_id not in tenant.tokens:
            raise KeyNotFound(f"tenant {name!r} has no token {token_id!r} (see `kvstore tenant list`)")
        for i in ids:
            del tenant.tokens[i]
            self._by_token.pop(i, None)
        self.generation = next(_GENERATIONS)
        self.changed.add(name)
        return len(ids)

    def lookup(self, token: str, now: float) -> Tenant | None:
        """The tenant whose token this is, while it has not expired, or None (the digests are
        compared in constant time)."""
        token_id = tokens.tenant_token_id(token)
        tenant = self._by_token.get(token_id) if token_id else None
        kept = tenant.tokens.get(token_id) if tenant is not None else None
        if kept is None or not tokens.same_digest(kept.digest, tokens.digest(token)):
            return None
        return tenant if not kept.expires or now < kept.expires else None

    def expiry(self, token_id: str) -> float:
        """When token `token_id` runs out (unix seconds; 0: never, or no such token)."""
        tenant = self._by_token.get(token_id)
        kept = tenant.tokens.get(token_id) if tenant is not None else None
        return kept.expires if kept is not None else 0.0

    def take_changes(self) -> dict[str, bytes | None]:
        changes: dict[str, bytes | None] = {n: self._by_name[n].encode() for n in self.changed}
        self.changed = set()
        return changes

    def count(self, key: str, tier: Tier, blocks: int, size: int) -> None:
        """`key` gained (blocks > 0) or lost replicas of `size` bytes in `tier`."""
        tenant = tenant_of(key)
        self.blocks[tenant, tier] += blocks
        self.usage[tenant, tier] += blocks * size
