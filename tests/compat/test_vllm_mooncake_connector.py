"""vLLM's own Mooncake store connector (MooncakeStoreConnector, vllm/distributed/kv_transfer/
kv_connector/v1/mooncake/store/), unchanged, on vLLM's CPU build, with kvstore as its store
through the mooncake.store alias: a producer saves a prompt's KV; a new consumer process loads
it (num_cached_tokens) and decodes exactly the tokens of a run without any connector; a consumer
facing an empty store loads nothing."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvstore.client import KVClient
from tests.compat.conftest import python_env

REPO = Path(__file__).resolve().parents[2]
VLLM_MISSING = importlib.util.find_spec("vllm") is None
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(VLLM_MISSING, reason="vLLM is not installed (scripts/install_vllm.sh)"),
]
BLOCK = 32


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.vllm.tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def _mooncake_config(tmp_path: Path, meta: str) -> Path:
    """vLLM's Mooncake config file (MOONCAKE_CONFIG_PATH), as its docs write it, master = kvstore."""
    path = tmp_path / f"mooncake-{meta.replace(':', '-')}.json"
    path.write_text(
        json.dumps(
            {
                "metadata_server": "P2PHANDSHAKE",
                "master_server_address": meta,
                "protocol": "tcp",
                "device_name": "",
                "global_segment_size": "16MB",
                "local_buffer_size": "16MB",
            }
        )
    )
    return path


def _vllm(model: str, role: str | None, prompts: list[list[int]], config: Path | None) -> dict[str, Any]:
    settings: dict[str, Any] = {"model": model, "block_size": BLOCK}
    if role is not None:
        settings["kv_transfer_config"] = {"kv_connector": "MooncakeStoreConnector", "kv_role": role}
    env = python_env(
        OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", **({"MOONCAKE_CONFIG_PATH": str(config)} if config else {})
    )
    commands = json.dumps({"op": "generate", "prompts": prompts, "max_tokens": 12}) + '\n{"op": "exit"}\n'
    proc = subprocess.run(
        [sys.executable, "-m", "kvstore.compat.mooncake.run", "-m", "tests.compat.vllm_instance", json.dumps(settings)],
        input=commands,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "store=kvstore.compat.mooncake.store" in log  # the alias served mooncake.store
    return json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")))


def test_vllm_mooncake_store_connector_saves_and_loads_through_kvstore(tiny_model, cluster, tmp_path):
    from tests.vllm.tiny_model import prompt_ids

    prompts = [prompt_ids(600, 1), prompt_ids(333, 2)]
    _, meta = cluster.serve("128MiB")
    _, empty_meta = cluster.serve("32MiB")
    plain = _vllm(tiny_model, None, prompts, None)
    produced = _vllm(tiny_model, "kv_producer", prompts, _mooncake_config(tmp_path, meta))
    assert produced["tokens"] == plain["tokens"]
    with KVClient(meta) as client:
        assert client.stats().keys > 0  # the blocks vLLM saved
    consumed = _vllm(tiny_model, "kv_consumer", prompts, _mooncake_config(tmp_path, meta))
    assert consumed["tokens"] == plain["tokens"]
    # A fresh process has an empty prefix cache: every cached token was loaded from kvstore,
    # all full blocks below each prompt's last token.
    assert consumed["cached"] == [(len(p) - 1) // BLOCK * BLOCK for p in prompts]
    control = _vllm(tiny_model, "kv_consumer", prompts, _mooncake_config(tmp_path, empty_meta))
    assert control["cached"] == [0, 0] and control["tokens"] == plain["tokens"]
