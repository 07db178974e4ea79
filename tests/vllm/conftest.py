import importlib.util

import pytest

from tests.cluster import Cluster

VLLM_MISSING = importlib.util.find_spec("vllm") is None
needs_vllm = pytest.mark.skipif(
    VLLM_MISSING,
    reason="vLLM is not installed: run scripts/install_vllm.sh (vLLM's CPU build) to run the connector tests",
)


@pytest.fixture(scope="module")
def store():
    """A metadata service and one storage daemon, started separately so a test can kill the
    daemon. Daemons are declared dead only after 120 s of silence, so a killed daemon's blocks
    stay listed and a load from it fails (rather than being a plain miss)."""
    c = Cluster()
    try:
        _, meta = c.meta({"KVSTORE_META_HEARTBEAT_TTL_S": "120"})
        daemon = c.daemon(meta, "256MiB")
        yield meta, daemon
    finally:
        c.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from tests.vllm.tiny_model import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
