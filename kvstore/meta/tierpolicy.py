"""Each tier's eviction policy (eviction.py: which of its blocks go first) and admission
(admission.py: which blocks it takes from the tier above), from `--eviction` and `--admission`
(MetaConfig; a setting names one choice for every tier or one per tier: `dram=lru,ssd=arc`).

Policies that keep their own state hear of every COMPLETE key as the index's watchers; one
instance serves every tier that names it (ARC's lists hold all keys, and a tier's eviction walks
its own segments' keys in that order).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvstore.config import MetaConfig
from kvstore.config.meta import ADMISSIONS, DEMOTED_INTO
from kvstore.config.tierspec import parse_tiers
from kvstore.meta import eviction
from kvstore.meta.admission import Admission, AdmitAll, AdmitReused, make_admission
from kvstore.meta.eviction import EvictionPolicy
from kvstore.meta.eviction_arc import ARCEviction
from kvstore.meta.index import ObjectIndex, Watcher
from kvstore.types import Tier


@dataclass(frozen=True)
class TierPolicies:
    eviction: Mapping[Tier, EvictionPolicy]
    admission: Mapping[Tier, Admission]

    def evicts(self, tier: Tier) -> EvictionPolicy:
        return self.eviction[tier]

    def admits(self, tier: Tier, key: str) -> bool:
        return self.admission[tier].admits(key)

    def check(self, index: ObjectIndex) -> None:
        for policy in {id(p): p for p in self.eviction.values()}.values():
            eviction.check(policy, index)


class Watchers:
    """Several watchers of one index, told in turn."""

    def __init__(self, watchers: list[Watcher]) -> None:
        self._all = tuple(watchers)

    def added(self, key: str) -> None:
        for w in self._all:
            w.added(key)

    def used(self, key: str) -> None:
        for w in self._all:
            w.used(key)

    def removed(self, key: str) -> None:
        for w in self._all:
            w.removed(key)


def build(config: MetaConfig, index: ObjectIndex, policy: EvictionPolicy | None = None) -> TierPolicies:
    """The policies `config` names (or `policy` for every tier's eviction), their watchers attached
    to `index`."""
    if policy is None:
        names = parse_tiers(config.eviction, eviction.POLICIES, "lru", "eviction")
        policies = {n: eviction.make_policy(n) for n in set(names.values())}
        evicts = {t: policies[n] for t, n in names.items()}
    else:
        evicts = dict.fromkeys(Tier, policy)
    names = parse_tiers(config.admission, ADMISSIONS, "all", "admission", DEMOTED_INTO)
    admissions = {n: make_admission(n) for n in set(names.values())}
    admits: dict[Tier, Admission] = {Tier.GPU: AdmitAll()} | {t: admissions[n] for t, n in names.items()}
    unique = {id(p): p for p in (*evicts.values(), *admits.values())}.values()
    watchers: list[Watcher] = [p for p in unique if isinstance(p, ARCEviction | AdmitReused)]
    index.watcher = Watchers(watchers) if len(watchers) > 1 else watchers[0] if watchers else None
    return TierPolicies(evicts, admits)
