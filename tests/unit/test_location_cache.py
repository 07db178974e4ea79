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


def _left(cache: LocationCache, key: str) -> float:
    entry = cache.get(key, time.monotonic())
    assert entry is not None
    return entry.until - time.monotonic()


def test_an_entry_lasts_until_its_earliest_grant_less_the_margin():
    cache = LocationCache(16, ttl_s=60)
    one, several = _result(NOW_MS + 3_000), _result(NOW_MS + 9_000, NOW_MS + 2_000, NOW_MS + 5_000)
    cache.put_many(["one", "several"], [one, several], {}, NOW_MS)
    assert 3 - EXPIRY_MARGIN_S - 0.2 < _left(cache, "one") <= 3 - EXPIRY_MARGIN_S
    assert 2 - EXPIRY_MARGIN_S - 0.2 < _left(cache, "several") <= 2 - EXPIRY_MARGIN_S
    entry = cache.get("one", time.monotonic())
    assert entry is not None and entry.result is one


def test_ttl_caps_an_entry_and_spent_or_failed_keys_are_not_kept():
    cache = LocationCache(16, ttl_s=1.0)
    results = [
        _result(NOW_MS + 60_000),  # capped at ttl_s
        _result(NOW_MS + 400),  # expires within the margin: not worth a read
        GetResult(ErrorCode.KEY_NOT_FOUND, "gone"),
        GetResult(size=8, checksum=1),  # no grant
    ]
    cache.put_many(["long", "short", "missing", "bare"], results, {}, NOW_MS)
    assert 0.8 < _left(cache, "long") <= 1.0
    assert len(cache) == 1
