"""Which shard owns a key: hash tags, an even spread, and what doubling the shards moves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.errors import InvalidArgument, WrongShard
from kvstore.metaclient.merge import concat, fan
from kvstore.shards import ShardSpec, hash_tag, shard_of, split


def test_a_hash_tag_is_the_first_braced_text_and_an_empty_one_is_no_tag():
    assert hash_tag("t/m/{chain7}/b3") == "chain7"
    assert hash_tag("{a}{b}") == "a"
    assert hash_tag("x{}y{z}") == "x{}y{z}"  # as in Redis Cluster: "{}" is no tag
    assert hash_tag("plain") == "plain"
    assert hash_tag("open{only") == "open{only"


def test_keys_that_share_a_tag_share_a_shard():
    chain = [f"tenant/m/{{c42}}/{i:04x}" for i in range(64)]
    assert len({shard_of(k, 8) for k in chain}) == 1


def test_hashed_keys_spread_within_10_percent():
    keys = [f"tenant/model/layout/{i:016x}" for i in range(40_000)]
    for count in (2, 4, 8):
        sizes = [len(v) for v in split(keys, count).values()]
        mean = len(keys) / count
        assert len(sizes) == count and max(abs(n - mean) / mean for n in sizes) < 0.10


@given(st.text(min_size=1, max_size=40), st.sampled_from([1, 2, 3, 4, 8]))
def test_doubling_the_shards_keeps_a_key_or_moves_it_to_i_plus_s(key, count):
    before, after = shard_of(key, count), shard_of(key, 2 * count)
    assert after in (before, before + count)


def test_split_keeps_each_shards_positions_in_order():
    keys = [f"k{i}" for i in range(100)]
    parts = split(keys, 4)
    assert sorted(i for idx in parts.values() for i in idx) == list(range(100))
    assert all(idx == sorted(idx) for idx in parts.values())


@pytest.mark.parametrize("text", ["4/4", "-1/2", "1", "a/b", "0/0", "0/2000"])
def test_a_malformed_shard_spec_is_refused(text):
    with pytest.raises(InvalidArgument):
        ShardSpec.parse(text)


def test_a_shard_spec_owns_its_keys_only():
    specs = [ShardSpec.parse(f"{i}/3") for i in range(3)]
    for key in (f"key-{i}" for i in range(300)):
        assert sum(s.owns(key) for s in specs) == 1
    assert ShardSpec.parse("").owns("anything") and str(ShardSpec.parse("2/3")) == "2/3"


def test_a_batch_a_shard_refused_goes_again_over_the_new_map_and_only_its_keys():
    """WRONG_SHARD from one shard (its map changed) resends that shard's keys over the map read
    again; what the other shards answered took effect there and is not sent twice."""
    keys = [f"fan/{i}" for i in range(40)]
    old, new = ["old0", "old1", "old2"], ["new0", "new1"]
    sent: list[tuple[str, list[str]]] = []

    def begin(cs, shard, idx):
        client, sub = cs[shard], [keys[i] for i in idx]
        sent.append((client, sub))

        def finish():
            if client == "old1":
                raise WrongShard("shard 1 of 2 does not own these keys", 7)
            return [f"{client}:{k}" for k in sub]

        return finish

    refreshed: list[int] = []

    def refresh(seen: WrongShard) -> list[str]:
        refreshed.append(seen.map_epoch)
        return new

    # The clients' names stand in for the shards' MetaClients: fan() only hands them to begin().
    out = fan(old, keys, begin, concat, refresh)  # type: ignore[arg-type]
    assert refreshed == [7]
    assert len(out) == len(keys) and all(r.endswith(k) for r, k in zip(out, keys))  # in the caller's order
    refused = {k for client, sub in sent if client == "old1" for k in sub}
    again = [k for client, sub in sent if client.startswith("new") for k in sub]
    assert refused and sorted(again) == sorted(refused)  # only the refused keys
    assert {k for c, sub in sent for k in sub if c in ("old0", "old2")} == set(keys) - refused
    for client, sub in sent:
        if client.startswith("new"):
            assert all(shard_of(k, 2) == int(client[-1]) for k in sub)

    with pytest.raises(WrongShard):  # a map wrong twice: typed
        fan(old, keys, begin, concat, lambda seen: old)  # type: ignore[arg-type, return-value]
