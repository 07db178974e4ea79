"""The prefix hit over several pools (kvstore.engines.sglang.hits), checked against SGLang's own
reference: its file backend's batch_exists_v2 (HiCacheFile, from the unpacked wheel) answers the
same question from files on disk, and both must agree on every case."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kvstore.engines.sglang.hits import ALL_PAGES, TRAILING_PAGES, PoolNeed, fold, leading
from tests.vllm.test_sglang_backend import sglang  # noqa: F401  (fixture)


def test_a_page_missing_in_any_pool_is_no_hit():
    present = [True, True, False, True]  # the indexer lost page 2
    hits = fold("kv", 4, [(PoolNeed("indexer", ALL_PAGES), present)])
    assert hits.kv_hit_pages == 2 and hits.restorable == [1, 2]
    assert hits.pool_hit_pages == {"kv": 4, "indexer": 2}


def test_trailing_pools_need_only_their_window_and_leave_holes():
    state = [False, True, False, True, True]  # Mamba state kept at some page ends only
    hits = fold("kv", 5, [(PoolNeed("mamba", TRAILING_PAGES, 1), state)])
    assert hits.restorable == [2, 4, 5] and hits.kv_hit_pages == 5
    window = fold("kv", 5, [(PoolNeed("swa", TRAILING_PAGES, 2), state)])
    assert window.restorable == [5] and window.pool_hit_pages["swa"] == 5


def test_all_pools_together():
    pools = [
        (PoolNeed("indexer", ALL_PAGES), [True] * 3 + [False]),
        (PoolNeed("mamba", TRAILING_PAGES), [False, True, False, True]),
    ]
    assert fold("kv", 4, pools).restorable == [2]
    assert fold("kv", 0, pools) == (0, {}, [])
    assert leading([True, False, True]) == 1


def test_a_policy_without_a_verdict_gates_nothing():
    hits = fold("kv", 3, [(PoolNeed("c4", "block_groups"), [False] * 3)])
    assert hits.kv_hit_pages == 3 and "c4" not in hits.pool_hit_pages


def _reference(real, root: Path):
    """SGLang's HiCacheFile with only what batch_exists_v2 reads (its constructor starts an
    evictor whose module needs CUDA-era packages)."""
    files = object.__new__(real.HiCacheFile)
    files.file_path, files.config_suffix, files.tp_config_suffix, files.metadata_cache = str(root), "_r", "_t", None
    return files


@pytest.mark.parametrize("seed", range(40))
def test_agrees_with_sglangs_own_backend(sglang, tmp_path, seed):  # noqa: F811
    _, real = sglang
    if real is None:
        pytest.skip("SGLang's wheel is not unpacked (scripts/install_vllm.sh)")
    rng = random.Random(seed)
    files = _reference(real, tmp_path)
    pages = [f"p{i}" for i in range(rng.randint(1, 8))]
    names = rng.sample([real.PoolName.INDEXER, real.PoolName.MAMBA, real.PoolName.SWA], rng.randint(0, 3))
    transfers, present = [], {}
    for name in [real.PoolName.KV, *names]:
        present[name] = [rng.random() < 0.8 for _ in pages]
        for page, stored in zip(pages, present[name]):
            if stored:
                (tmp_path / f"{files._get_component_key(page, name)}.bin").touch()
        if name is not real.PoolName.KV:
            policy = rng.choice([real.PoolHitPolicy.ALL_PAGES, real.PoolHitPolicy.TRAILING_PAGES])
            window = rng.randint(1, 3)
            transfers.append(real.PoolTransfer(name=name, keys=pages[-window:], hit_policy=policy))
    want = files.batch_exists_v2(pages, transfers)
    needs = [(PoolNeed(str(t.name), t.hit_policy.value, len(t.keys)), present[t.name]) for t in transfers]
    got = fold("kv", leading(present[real.PoolName.KV]), needs)
    assert (got.kv_hit_pages, got.pool_hit_pages, got.restorable) == (
        want.kv_hit_pages,
        {str(k): v for k, v in want.extra_pool_hit_pages.items()},
        want.restorable_prefix_pages,
    )
