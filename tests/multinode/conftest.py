"""Tests that start Ray clusters of their own: a `ray start --head` on loopback, or
several nodes with ``ray.cluster_utils.Cluster``. They run in a pytest process of
their own (``./dev test`` runs the main suite, then ``pytest tests/multinode``):
the main suite shares one Ray for the whole session.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.multinode.ray_clusters import start_ray_head


@pytest.fixture(scope="module")
def ray_head():
    head = start_ray_head()
    yield head
    head.stop()
    leftovers = subprocess.run(["pgrep", "-f", str(head.directory)], capture_output=True, text=True)
    shutil.rmtree(head.directory, ignore_errors=True)
    assert not leftovers.stdout.strip(), f"processes of the test head survived: {leftovers.stdout}"
