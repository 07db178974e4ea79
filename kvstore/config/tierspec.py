"""Per-tier choices written as one setting: `arc` names one choice for every tier, `dram=arc,ssd=lru`
one per tier, `lru,ssd=arc` one for every tier and another for one of them (a TIER=NAME item wins
over a bare NAME wherever it stands). A tier left unnamed keeps the default. Used by `--eviction`
and `--admission` (docs/traces.md)."""

from __future__ import annotations

from collections.abc import Iterable

from kvstore.errors import InvalidArgument
from kvstore.types import Tier


def parse_tiers(
    setting: str, choices: Iterable[str], default: str, what: str, tiers: Iterable[Tier] = tuple(Tier)
) -> dict[Tier, str]:
    """The choice of each of `tiers` (those the setting applies to) from `setting`; InvalidArgument
    naming `what` for an unknown choice, or a tier not one of them."""
    allowed, named_tiers = tuple(choices), tuple(tiers)
    every: str | None = None
    each: dict[Tier, str] = {}
    for item in (part.strip() for part in setting.split(",")):
        tier_name, eq, name = item.rpartition("=")
        name = name.strip()
        if name not in allowed:
            raise InvalidArgument(
                f"{what} {setting!r}: {name!r} is not one of {', '.join(allowed)} (write NAME or TIER=NAME, "
                "comma-separated)"
            )
        if not eq:
            every = name
            continue
        tier = next((t for t in named_tiers if t.value == tier_name.strip().lower()), None)
        if tier is None:
            raise InvalidArgument(
                f"{what} {setting!r}: {tier_name.strip()!r} is not a tier it applies to "
                f"(one of {', '.join(t.value for t in named_tiers)})"
            )
        each[tier] = name
    return {t: each.get(t, every or default) for t in named_tiers}
