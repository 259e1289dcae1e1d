from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# Workers import test jobs (tests.jobs:...) too.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))

from tests.harness import Cluster  # noqa: E402


@pytest.fixture
def cluster(tmp_path: object) -> Iterator[Cluster]:
    with Cluster(str(tmp_path), workers=2).running() as c:
        yield c
