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
