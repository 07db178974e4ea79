"""A put batch's region commits overlap its copies: at most COMMITS_IN_FLIGHT PutCommits of
COMMIT_KEYS keys are in flight while the next values are copied. Every commit's answer is read,
also once one has failed, and the failure is raised after the others are settled."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from kvstore.client import KVClient
from kvstore.client import writer as writer_module
from kvstore.config import ClientConfig
from kvstore.errors import Unavailable
from kvstore.wire.calls import PutCommit
from tests.inprocess import InProcessStore

N = 1000  # a fresh client's regions grow (256 KiB, 512 KiB, ...): commits of 64, 128, 256, 256, 256, 40


class Commits:
    """The client's metadata client, counting the PutCommits it begins and failing the answers of
    the n-th for each n in `fail` (which the service did take: only their answers are lost)."""

    def __init__(self, inner: Any, fail: tuple[int, ...] = ()) -> None:
        self.inner, self.fail, self.most_in_flight = inner, fail, 0
        self.sent: list[list[str]] = []  # the keys of each PutCommit begun
        self._in_flight = 0

    def begin(self, req: Any, timeout_s: float | None = None) -> Callable[[], Any]:
        if not (isinstance(req, PutCommit) and req.keys):
            return self.inner.begin(req, timeout_s)
        self.sent.append(list(req.keys))
        self._in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self._in_flight)
        wait, n = self.inner.begin(req, timeout_s), len(self.sent)

        def answer() -> Any:
            self._in_flight -= 1
            reply = wait()
            if n in self.fail:
                raise Unavailable(f"the answer of PutCommit {n} was lost")
            return reply

        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture
def client():
    with (
        InProcessStore(dram_size=64 << 20, segment_size=32 << 20) as store,
        KVClient(store.address, ClientConfig(transports=("shm",), region_bytes=8 << 20)) as c,
    ):
        yield c


def values() -> list[bytes]:
    return [os.urandom(64) * 64 for _ in range(N)]


def test_a_batch_is_committed_in_overlapping_calls(client):
    pool = client._region_pool
    pool.meta = commits = Commits(pool.meta)
    keys, vals = [f"k{i}" for i in range(N)], values()
    assert client.put_many(keys, vals) == [True] * N
    assert sorted(k for sent in commits.sent for k in sent) == sorted(keys)
    assert max(map(len, commits.sent)) == writer_module.COMMIT_KEYS and commits.most_in_flight == 2
    assert client.get_many(keys) == vals


def test_a_failed_commit_is_raised_after_the_others_are_settled(client):
    pool = client._region_pool
    pool.meta = commits = Commits(pool.meta, fail=(2,))
    keys, vals = [f"k{i}" for i in range(N)], values()
    with pytest.raises(Unavailable, match="PutCommit 2 was lost"):
        client.put_many(keys, vals)
    assert len(commits.sent) == 3  # the fourth was not sent: the second's failure came first
    stored = {k for sent in commits.sent for k in sent}  # the second's too: only its answer was lost
    assert client.exists_many(keys) == [k in stored for k in keys]
    assert client.get_many(sorted(stored)) == [vals[int(k[1:])] for k in sorted(stored)]
    pool.meta = commits.inner
    assert client.put_many(keys, vals) == [k not in stored for k in keys]  # the client goes on
    assert client.get_many(keys) == vals
    assert all(r.inflight == 0 for r in [pool._current] if r is not None)


def test_the_first_failed_commit_is_the_error_raised(client):
    pool = client._region_pool
    pool.meta = commits = Commits(pool.meta, fail=(1, 2))  # both in flight when the first fails
    with pytest.raises(Unavailable, match="PutCommit 1 was lost"):
        client.put_many([f"k{i}" for i in range(N)], values())
    assert len(commits.sent) == 2
