"""Fleet tests: hosts in network namespaces (benchmarks/fleet/netns.py, docs/fleet.md). Every test
here but the checker's own is marked `fleet` and `slow` (the quick run, -m "not slow", skips
them), and skips, naming what is missing, where the machine cannot make namespaces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.fleet.netns import Fleet, missing

NO_ROOT_NEEDED = ("test_checker.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.fspath)
        if "tests/fleet/" in path and not path.endswith(NO_ROOT_NEEDED):
            item.add_marker(pytest.mark.fleet)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def net() -> Iterator[Fleet]:
    """An empty fleet, removed at the end of the test (also when it fails or is interrupted)."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    with Fleet() as fleet:
        yield fleet


@pytest.fixture
def kvfleet(net: Fleet, tmp_path: Path):
    """redis, meta1 (leader), meta2 (standby), d1, d2, c1: the store across six hosts."""
    from tests.fleet import roles

    return roles.start(net, tmp_path)
