"""Fixtures of the Spark bridge suite: one SparkSession for every test, and shared clusters."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tests.harness import Cluster

# Spark's Python workers must run this interpreter (the virtualenv's), and import the repo.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    session = (SparkSession.builder
               .master("local[2,4]")             # 2 cores; a failed task is retried (4 attempts)
               .appName("millstream-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for a module's tests that disturb no process (each uses its own streams)."""
    with Cluster(str(tmp_path_factory.mktemp("cluster")), workers=2).running() as c:
        yield c
