"""Every run has its own commit-log incarnation: two jobs restored from one savepoint into
the same Parquet directory both commit their output (neither is taken for the other's
and skipped, nor truncated by it), and what the stopped run committed stays once."""

from __future__ import annotations

import collections
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raystream.spark.commit_log import list_entries, read_committed
from tests.support.jobs import env_at
from tests.support.oracles import assert_exactly_once
from tests.support.pipelines import build_job


def rows(table: pa.Table) -> collections.Counter:
    return collections.Counter(zip(*(table.column(c).to_pylist() for c in ("k", "v", "i", "n"))))


def committed_by(out: str, incarnation: str) -> pa.Table:
    """The rows of the files the run ``incarnation`` committed."""
    return pa.concat_tables(pq.read_table(os.path.join(out, f["path"]))
                            for e in list_entries(out, incarnation) for f in e.files)


@pytest.mark.slow
def test_two_runs_restored_from_one_savepoint_each_commit_their_output(ray_session, tmp_path):
    out = str(tmp_path / "out")
    env = env_at(2, str(tmp_path / "chk"))
    build_job(env, out)
    client = env.execute_async("first")
    deadline = time.monotonic() + 60
    while len(client.progress()["completed_checkpoints"]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.stop_with_savepoint(str(tmp_path / "sp"))
    before = rows(read_committed(out))
    assert before, "stopped midway"

    for run in ("second", "third"):
        env = env_at(2, str(tmp_path / f"chk-{run}"))
        build_job(env, out)
        env.execute(run, restore_from=str(tmp_path / "sp"))
    entries = list_entries(out)
    runs = sorted({e.incarnation for e in entries}, key=lambda i: min(
        e.checkpoint_id for e in entries if e.incarnation == i))
    assert len(runs) == 3, runs  # one incarnation per run
    committed_before = committed_by(out, runs[0])
    assert rows(committed_before) == before
    for run in runs[1:]:  # each restored run continues the stopped one exactly once
        assert_exactly_once(pa.concat_tables([committed_before,
                                              committed_by(out, run)]))
