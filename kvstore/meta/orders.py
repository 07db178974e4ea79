"""Orders over the COMPLETE keys besides the index's own recency, kept as keys come and go, so
that a caller walks only what it returns (never every key, under the store's lock):

- per tenant (namespaced keys), least recently used first: a tenant at its quota evicts its own
  oldest blocks without stepping over every other tenant's;
- byte order: a ListKeys page costs O(log n + its keys), and paging a store is linear, not
  quadratic.

The default tenant's keys (no namespace) have no order of their own: its quota, if any, walks
the global recency, skipping the others' keys.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sortedcontainers import SortedList  # type: ignore[import-untyped]

from kvstore.meta.tenants import tenant_of


class KeyOrders:
    def __init__(self) -> None:
        self._by_tenant: dict[int, dict[str, None]] = {}  # insertion order = recency
        self.sorted: SortedList = SortedList()

    def added(self, key: str) -> None:
        """`key` became COMPLETE, as the most recently used."""
        if key[:1] == "\0":
            self._by_tenant.setdefault(tenant_of(key), {})[key] = None
        self.sorted.add(key)

    def removed(self, key: str) -> None:
        if key[:1] == "\0":
            tenant = tenant_of(key)
            keys = self._by_tenant.get(tenant)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._by_tenant[tenant]
        self.sorted.discard(key)

    def touched(self, key: str) -> None:
        """`key` is now the most recently used of its tenant's."""
        if key[:1] == "\0":
            keys = self._by_tenant[tenant_of(key)]
            del keys[key]
            keys[key] = None

    def of_tenant(self, tenant: int) -> Iterator[str]:
        """A namespaced tenant's keys, least recently used first. Do not mutate while iterating."""
        return iter(self._by_tenant.get(tenant, ()))

    def page(self, prefix: str, cursor: str, limit: int, hidden: str = "") -> tuple[list[str], bool]:
        """The first `limit` keys in byte order that start with `prefix`, not with `hidden`, and
        sort after `cursor`; and whether more follow."""
        found: list[str] = []
        start, inclusive = (prefix, True) if cursor < prefix else (cursor, False)
        while len(found) <= limit:
            skipped_to = ""
            for key in self.sorted.irange(minimum=start, inclusive=(inclusive, True)):
                if not key.startswith(prefix):
                    return found[:limit], len(found) > limit
                if hidden and key.startswith(hidden):
                    skipped_to = _after(hidden)  # the hidden keys are one run: jump past it
                    break
                found.append(key)
                if len(found) > limit:
                    break
            if not skipped_to:
                break
            start, inclusive = skipped_to, True
        return found[:limit], len(found) > limit

    def check(self, complete: Mapping[str, object]) -> None:
        assert len(self.sorted) == len(complete), "the byte order lost or kept a key"
        namespaced = sum(len(keys) for keys in self._by_tenant.values())
        assert namespaced == sum(1 for k in complete if k[:1] == "\0"), "a tenant's order lost or kept a key"


def _after(prefix: str) -> str:
    """The least string greater than every string that starts with `prefix`."""
    while prefix and prefix[-1] == "\U0010ffff":
        prefix = prefix[:-1]
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\U0010ffff"
