"""Who is calling: every call's bearer token, turned into a Principal, and what each may call.

    tenant   a tenant's token: the data calls (put, get, exists, match, remove, pin, list,
             describe) in its own key namespace, and a view of the stats of its own keys
    admin    the operator's token (the file or $KVSTORE_TOKEN the service started with), or a
             token of a tenant marked admin: everything, its data calls as its tenant's
    daemon   the credential derived from the grant secret: mounting segments, heartbeats, tier
             moves, announcing blocks

With authentication off (MetaConfig.auth = false) every caller is the admin of the default
tenant, as before tenants existed: only for a service that nothing untrusted can reach.

A tenant token grants nothing until the tenant registry of the store answering checks it. Where
there is none (a standby, a leader loading its records, a rebuild after Redis came back), a
token of a tenant token's shape is let through for ServiceInfo and Stats only; its other calls
get why there is none (NotLeader, naming the leader, or Unavailable), as a standby answers.

A fast-lane connection authenticates once (a Session) and is checked again on a call whenever
the registry's generation moved since (another store, a tenant or token changed): a token
revoked or a tenant demoted takes effect on the next call of every connection already open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvstore import tokens
from kvstore.clock import Clock, SystemClock
from kvstore.errors import KVStoreError, PermissionDenied, Unauthenticated, Unavailable
from kvstore.meta.tenants import DEFAULT_ID, DEFAULT_NAME, Tenant, TenantRegistry
from kvstore.wire.call import Role
from kvstore.wire.calls import CALLS

# Who may make each call: its class's `role` (kvstore.wire.calls).
DATA, DAEMON, ADMIN, ANYONE = (frozenset(n for n, c in CALLS.items() if c.role is r) for r in Role)


@dataclass(frozen=True)
class Principal:
    tenant: int
    name: str
    admin: bool = False
    daemon: bool = False
    trust_shm: bool = True  # may be offered shm and mooncake
    token_id: str = ""  # the tenant token it authenticated with ("" for the others)
    expires: float = 0.0  # when that token runs out (unix seconds; 0: never)
    # A tenant token no registry here could check: it may call ANYONE only, and is told this
    # (NotLeader / Unavailable) for anything else.
    unchecked: KVStoreError | None = None

    def may_call(self, method: str) -> bool:
        if method in ANYONE:
            return True
        if self.unchecked is not None:
            return False
        if self.admin:
            return True
        if method in DAEMON:
            return self.daemon
        return method in DATA and not self.daemon

    def check(self, method: str) -> None:
        if self.may_call(method):
            return
        if self.unchecked is not None:
            raise self.unchecked
        role = "a daemon" if self.daemon else f"tenant {self.name!r}"
        raise PermissionDenied(f"{method} is not allowed for {role}: it needs the admin's token")


OPERATOR = Principal(DEFAULT_ID, DEFAULT_NAME, admin=True)
_DAEMON = Principal(DEFAULT_ID, "daemon", daemon=True)
_UNCHECKED_ID = -1  # a namespace no tenant has (and no call of an unchecked token reaches a store)


def _of(tenant: Tenant, token_id: str, expires: float) -> Principal:
    return Principal(
        tenant.id, tenant.name, admin=tenant.admin, trust_shm=tenant.trust_shm, token_id=token_id, expires=expires
    )


def _no_registry() -> KVStoreError:
    return Unavailable("this metadata service holds no tenant registry now (taking over, or loading it): retry")


@dataclass
class Session:
    """A fast-lane connection's caller: who it is, and the registry generation that was checked
    against (0: none was there). The token is kept to check it again; never shown."""

    token: str = field(repr=False)
    who: Principal
    generation: int


class Authenticator:
    """`registry()` is the tenant registry of the store answering now (None where there is none:
    a standby, a leader loading its records); `absent()` says why there is none, as the error a
    tenant's data call gets then (NotLeader naming the leader, Unavailable)."""

    def __init__(
        self,
        enabled: bool,
        admin_token: str,
        daemon_token: str,
        registry: Callable[[], TenantRegistry | None],
        clock: Clock | None = None,
        absent: Callable[[], KVStoreError] = _no_registry,
    ) -> None:
        self.enabled = enabled
        self._clock = clock or SystemClock()
        self._admin = tokens.digest(admin_token) if admin_token else ""
        self._daemon = tokens.digest(daemon_token)
        self._registry = registry
        self._absent = absent

    def principal(self, token: str) -> Principal:
        """The caller a token names; Unauthenticated for none, or one that is not known."""
        if not self.enabled:
            return OPERATOR
        if not token:
            raise Unauthenticated(
                "this call carries no token: set $KVSTORE_TOKEN (or ClientConfig.token) to a token from "
                "`kvstore tenant token NAME`, or use the operator's token file the service names at start"
            )
        if len(token) > tokens.MAX_TOKEN_CHARS:
            raise Unauthenticated("the token is not one this service made (too long)")
        token_id = tokens.tenant_token_id(token)
        if token_id:
            registry = self._registry()
            if registry is None:
                return Principal(_UNCHECKED_ID, "unchecked", trust_shm=False, unchecked=self._absent())
            tenant = registry.lookup(token, self._clock.now())
            if tenant is None:
                raise Unauthenticated("the token is not known here (revoked, expired, or of another store)")
            return _of(tenant, token_id, registry.expiry(token_id))
        digest = tokens.digest(token)
        if self._admin and tokens.same_digest(digest, self._admin):
            return OPERATOR
        if tokens.same_digest(digest, self._daemon):
            return _DAEMON
        raise Unauthenticated("the token is not known here (revoked, mistyped, or of another store)")

    def _generation(self) -> int:
        registry = self._registry()
        return registry.generation if registry is not None else 0

    def session(self, token: str) -> Session:
        """A connection's caller, from the token of its HELLO (Unauthenticated as principal())."""
        generation = self._generation()  # read first: the principal is at least this fresh
        return Session(token, self.principal(token), generation)

    def current(self, session: Session) -> Principal:
        """Who a connection's caller is for its next call: one integer compare while nothing
        changed; checked again when the registry did (another store, a tenant or token changed)
        or there was none to check against. Unauthenticated for a token revoked, expired, or
        never known."""
        generation = self._generation()
        who = session.who
        if generation != session.generation or who.unchecked is not None:
            who = session.who = self.principal(session.token)
            session.generation = generation
        elif who.expires and self._clock.now() >= who.expires:
            raise Unauthenticated("the token expired")
        return who
