"""Who is calling: every call's bearer token, turned into a Principal, and what each may call.

    tenant   a tenant's token: the data calls (put, get, exists, match, remove, pin, list,
             describe) in its own key namespace, and a view of the stats of its own keys
    admin    the operator's token (the file or $KVSTORE_TOKEN the service started with), or a
             token of a tenant marked admin: everything, its data calls as its tenant's
    daemon   the credential derived from the grant secret: mounting segments, heartbeats, tier
             moves, announcing blocks

With authentication off (MetaConfig.auth = false) every caller is the admin of the default
tenant, as before tenants existed: only for a service that nothing untrusted can reach.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvstore import tokens
from kvstore.clock import Clock, SystemClock
from kvstore.errors import PermissionDenied, Unauthenticated
from kvstore.meta.tenants import DEFAULT_ID, DEFAULT_NAME, Tenant, TenantRegistry

DATA = frozenset(
    {"PutStart", "PutEnd", "PutRevoke", "Get", "Exists", "MatchPrefix", "Remove", "Pin", "Unpin", "ListKeys",
     "Describe", "Reserve", "PutCommit"}
)  # fmt: skip
DAEMON = frozenset({"MountSegment", "UnmountSegment", "Heartbeat", "ClaimMoves", "CompleteMoves", "AnnounceBlocks"})
ADMIN = frozenset({"TenantAdd", "TenantToken", "TenantRevoke", "TenantList"})
ANYONE = frozenset({"Stats", "ServiceInfo"})


@dataclass(frozen=True)
class Principal:
    tenant: int
    name: str
    admin: bool = False
    daemon: bool = False
    trust_shm: bool = True  # may be offered shm and mooncake
    token_id: str = ""  # the tenant token it authenticated with ("" for the others)

    def may_call(self, method: str) -> bool:
        if method in ANYONE or self.admin:
            return True
        if method in DAEMON:
            return self.daemon
        return method in DATA and not self.daemon

    def check(self, method: str) -> None:
        if not self.may_call(method):
            role = "a daemon" if self.daemon else f"tenant {self.name!r}"
            raise PermissionDenied(f"{method} is not allowed for {role}: it needs the admin's token")


OPERATOR = Principal(DEFAULT_ID, DEFAULT_NAME, admin=True)
_DAEMON = Principal(DEFAULT_ID, "daemon", daemon=True)
_UNVERIFIED = Principal(-1, "unverified", trust_shm=False)  # a namespace no tenant has


def _of(tenant: Tenant, token_id: str) -> Principal:
    return Principal(tenant.id, tenant.name, admin=tenant.admin, trust_shm=tenant.trust_shm, token_id=token_id)


class Authenticator:
    """`registry()` is the tenant registry of the store answering now (None on a standby: its
    callers are told to go to the leader, whoever they are)."""

    def __init__(
        self,
        enabled: bool,
        admin_token: str,
        daemon_token: str,
        registry: Callable[[], TenantRegistry | None],
        clock: Clock | None = None,
    ) -> None:
        self.enabled = enabled
        self._clock = clock or SystemClock()
        self._admin = tokens.digest(admin_token) if admin_token else ""
        self._daemon = tokens.digest(daemon_token)
        self._registry = registry

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
        if tokens.tenant_token_id(token):
            registry = self._registry()
            tenant = registry.lookup(token, self._clock.now()) if registry is not None else None
            if tenant is None and registry is None:
                return _UNVERIFIED  # a standby: its data calls are refused (NotLeader) anyway
            if tenant is not None:
                return _of(tenant, tokens.tenant_token_id(token))
            raise Unauthenticated("the token is not known here (revoked, expired, or of another store)")
        digest = tokens.digest(token)
        if self._admin and tokens.same_digest(digest, self._admin):
            return OPERATOR
        if tokens.same_digest(digest, self._daemon):
            return _DAEMON
        raise Unauthenticated("the token is not known here (revoked, mistyped, or of another store)")

    def still_valid(self, principal: Principal) -> bool:
        """Whether a principal authenticated earlier (a fast-lane connection's) still is: its
        tenant token not revoked since."""
        if not principal.token_id:
            return True
        registry = self._registry()
        return registry is None or registry.token_alive(principal.token_id, self._clock.now())
