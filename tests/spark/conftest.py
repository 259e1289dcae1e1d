"""Fixtures of the Spark bridge suite: shared clusters. Its one SparkSession (``spark``) is in
tests/conftest.py, started before any test uses gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import Cluster


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for a module's tests that disturb no process (each uses its own streams)."""
    with Cluster(str(tmp_path_factory.mktemp("cluster")), workers=2).running() as c:
        yield c
