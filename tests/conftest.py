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


# Spark's Python workers must run this interpreter (the virtualenv's), and import the repo.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One SparkSession for every test that asks for it."""
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


@pytest.fixture(scope="session", autouse=True)
def _spark_before_grpc(request: pytest.FixtureRequest) -> None:
    """When the run has tests that use Spark, start it before the first test, while no test
    has used gRPC yet. PySpark starts its JVM through a fork whose pre-exec hook runs Python;
    a fork while another thread of this process is inside gRPC (a leftover channel's poller,
    an injector's watermark thread) can kill the child before it execs, and then every Spark
    test errors with JAVA_GATEWAY_EXITED (CI, 20261129: "Other threads are currently calling
    into gRPC, skipping fork() handlers"). The benchmark starts Spark first for the same reason."""
    if any("spark" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("spark")
