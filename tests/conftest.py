import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.cluster import ADMIN_TOKEN, Cluster

# The operator's token for every service the tests start (in process or not) and every client:
# the tests never touch the user's own token file.
os.environ["KVSTORE_TOKEN"] = ADMIN_TOKEN


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also run tests/faults' soak (random faults under load) for this long",
    )


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A CA, server and client certificates, another CA, a self-signed certificate (tests/pki.py)."""
    from tests.pki import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.close()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (GPU tier); none on this host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
