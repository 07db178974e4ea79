"""What the dashboard page and `kvstore top` show, as one JSON-able snapshot.

Counts (keys, bytes, blocks, hits, evictions, ...) are read from the store at the moment of the
request, so they are exactly what `kvstore stat` says at that moment; rates (hits per second,
daemon bandwidth) come from the service's samples over the last `window_s`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstore.metrics.history import History, Sample
from kvstore.observe import METRICS_ENDPOINT
from kvstore.results import StoreStats

WINDOW_S = 30.0


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _window(samples: list[Sample], window_s: float) -> tuple[Sample, Sample] | None:
    """The oldest sample within `window_s` of the newest, and the newest."""
    if len(samples) < 2:
        return None
    newest = samples[-1]
    oldest = next((s for s in samples if newest.time - s.time <= window_s), samples[0])
    if oldest is newest:
        oldest = samples[-2]
    return oldest, newest


def _lookup_rates(lookups: dict[tuple[str, str], float]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for call in ("get", "match_prefix", "exists"):
        hit, miss = lookups.get((call, "hit"), 0.0), lookups.get((call, "miss"), 0.0)
        out[call] = {"hit": int(hit), "miss": int(miss), "hit_rate": _ratio(hit, hit + miss)}
    return out


def snapshot(
    stats: StoreStats,
    lookups: dict[tuple[str, str], float],
    history: History,
    now: float,
    window_s: float = WINDOW_S,
) -> dict[str, Any]:
    samples = history.samples()
    span = _window(samples, window_s)
    looked = _lookup_rates(lookups)
    gets = looked["get"]["hit"] + looked["get"]["miss"]
    tiers = []
    for t in stats.tiers:
        tiers.append(
            {
                "tier": t.tier.value,
                "capacity": t.capacity,
                "used": t.used,
                "fill": _ratio(t.used, t.capacity),
                "blocks": t.blocks,
                "hits": t.hits,
                "hit_share": _ratio(t.hits, gets),  # of all Get lookups, those a replica here served
                "evictions": t.evictions,
                "demotions": t.demotions,
                "promotions": t.promotions,
            }
        )
    daemons = []
    for d in stats.daemons:
        capacity = sum(s.capacity for s in d.segments)
        transports = sorted({e.transport for s in d.segments for e in s.endpoints} - {METRICS_ENDPOINT})
        entry: dict[str, Any] = {
            "daemon_id": d.daemon_id,
            "segments": len(d.segments),
            "tiers": sorted({s.tier.value for s in d.segments}),
            "capacity": capacity,
            "used": d.used,
            "fill": _ratio(d.used, capacity),
            "transports": transports,
            "heartbeat_age_s": max(0.0, now - d.last_heartbeat),
            "in_bytes_per_s": None,
            "out_bytes_per_s": None,
        }
        if span is not None:
            old, new = span
            a, b = old.traffic.get(d.daemon_id), new.traffic.get(d.daemon_id)
            if a is not None and b is not None and new.time > old.time:
                entry["in_bytes_per_s"] = max(0.0, b.bytes_in - a.bytes_in) / (new.time - old.time)
                entry["out_bytes_per_s"] = max(0.0, b.bytes_out - a.bytes_out) / (new.time - old.time)
        daemons.append(entry)
    rates: dict[str, float | None] = {"get_per_s": None, "get_hit_rate": None}
    if span is not None:
        old, new = span
        dt = new.time - old.time
        hit = new.lookups.get(("get", "hit"), 0.0) - old.lookups.get(("get", "hit"), 0.0)
        miss = new.lookups.get(("get", "miss"), 0.0) - old.lookups.get(("get", "miss"), 0.0)
        rates = {"get_per_s": (hit + miss) / dt if dt > 0 else None, "get_hit_rate": _ratio(hit, hit + miss)}
    routers = []
    latest = samples[-1].routers if samples else {}
    for url in history.routers:
        state = latest.get(url)
        summary = (state or {}).get("summary") or {}
        routers.append({"url": url, "reachable": state is not None, **summary})
    return {
        "time": now,
        "store": {
            "keys": stats.keys,
            "pending": stats.pending,
            "capacity": stats.capacity,
            "used": stats.used,
            "fill": _ratio(stats.used, stats.capacity),
            "evictions": stats.evictions,
            "revoked_puts": stats.revoked_puts,
            "leased": stats.leased,
            "pinned": stats.pinned,
            "under_replicated": stats.under_replicated,
            "quarantined_bytes": stats.quarantined_bytes,
        },
        "lookups": looked,
        "rates": rates,
        "tiers": tiers,
        "daemons": daemons,
        "events": [e.to_dict() for e in reversed(history.events()[-50:])],
        "routers": routers,
    }


SnapshotSource = Callable[[], dict[str, Any]]
