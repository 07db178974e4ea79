"""The client's location cache keeps an entry until shortly before the earliest grant of its key
expires, and at most ttl_s; keys that failed, or came without a grant, are not kept."""

from __future__ import annotations

import time

from kvstore.client.locations import EXPIRY_MARGIN_S, LocationCache
from kvstore.errors import ErrorCode
from kvstore.results import GetResult
from kvstore.types import Grant, GrantMode

NOW_MS = 1_700_000_000_000


def _result(*expires_ms: int) -> GetResult:
    grants = tuple(Grant(f"seg-{i}", 0, 8, GrantMode.READ, e, b"m") for i, e in enumerate(expires_ms))
    return GetResult(size=8, checksum=1, grants=grants, lease_id=3)


def _put(cache: LocationCache, keys: list[str], results: list[GetResult]) -> tuple[float, float]:
    """put_many, and the monotonic clock read just before and just after it: the entries' `until`
    is the clock the cache read in between, plus each entry's lifetime."""
    before = time.monotonic()
    cache.put_many(keys, results, {}, NOW_MS)
    return before, time.monotonic()


def _lasts(cache: LocationCache, key: str, window: tuple[float, float], lifetime_s: float) -> bool:
    entry = cache.get(key, window[0])  # good at the time of the put: never dropped as expired here
    assert entry is not None
    return window[0] + lifetime_s <= entry.until <= window[1] + lifetime_s


def test_an_entry_lasts_until_its_earliest_grant_less_the_margin():
    cache = LocationCache(16, ttl_s=60)
    one, several = _result(NOW_MS + 3_000), _result(NOW_MS + 9_000, NOW_MS + 2_000, NOW_MS + 5_000)
    window = _put(cache, ["one", "several"], [one, several])
    assert _lasts(cache, "one", window, 3 - EXPIRY_MARGIN_S)
    assert _lasts(cache, "several", window, 2 - EXPIRY_MARGIN_S)
    entry = cache.get("one", window[0])
    assert entry is not None and entry.result is one


def test_ttl_caps_an_entry_and_spent_or_failed_keys_are_not_kept():
    cache = LocationCache(16, ttl_s=1.0)
    results = [
        _result(NOW_MS + 60_000),  # capped at ttl_s
        _result(NOW_MS + 400),  # expires within the margin: not worth a read
        GetResult(ErrorCode.KEY_NOT_FOUND, "gone"),
        GetResult(size=8, checksum=1),  # no grant
    ]
    window = _put(cache, ["long", "short", "missing", "bare"], results)
    assert _lasts(cache, "long", window, 1.0)
    assert len(cache) == 1
