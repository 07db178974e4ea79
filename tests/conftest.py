import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.cluster import Cluster  # noqa: E402


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
