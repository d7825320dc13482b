"""A job reports FINISHED only once every committer confirmed its final commit.

A committer still committing when the job ends (here: its final commit sleeps
12 s, once, and the job waits 5 s for its subtasks to stop) does not stop in time; the job fails over instead of
finishing without that commit, and the restored committer commits it.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import numpy as np
import pytest

import raystream as rs

N = 2_000


class RowsWriter(rs.SinkWriter):
    def open(self, ctx):
        self.rows = []

    def write(self, batch):
        self.rows.extend(batch.column("i").to_pylist())

    def prepare_commit(self, checkpoint_id):
        rows, self.rows = self.rows, []
        if checkpoint_id is None:  # end of input: always one entry, which marks the final commit
            return [{"id": uuid.uuid4().hex, "rows": rows, "final": True}]
        return [{"id": uuid.uuid4().hex, "rows": rows}] if rows else []


class EntryCommitter(rs.Committer):
    """One JSON entry per (incarnation, checkpoint), written once; the final commit (the
    one holding an end-of-input entry) sleeps while the marker file exists (deleted
    first: it happens once). The job takes no periodic checkpoint, so that entry is
    committed by the final checkpoint (a periodic one could commit it first)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _entries(self, incarnation: str):
        for name in os.listdir(self.directory):
            if name.startswith(incarnation + "@"):
                with open(os.path.join(self.directory, name)) as f:
                    yield int(name.split("@")[1].split(".")[0]), json.load(f)

    def commit(self, incarnation, checkpoint_id, committables):
        marker = os.path.join(self.directory, "_slow")
        if any(c.get("final") for c in committables) and os.path.exists(marker):
            os.remove(marker)
            time.sleep(12)
        path = os.path.join(self.directory, f"{incarnation}@{checkpoint_id}.json")
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as f:
                json.dump(committables, f)
            os.replace(path + ".tmp", path)

    def committed_ids(self, incarnation):
        return {c["id"] for _, entry in self._entries(incarnation) for c in entry}

    def truncate(self, incarnation, above):
        dropped = [cid for cid, _ in self._entries(incarnation) if cid > above]
        for cid in dropped:
            os.remove(os.path.join(self.directory, f"{incarnation}@{cid}.json"))
        return dropped


@pytest.mark.slow
def test_a_job_is_finished_only_after_its_final_commit(ray_session, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "_slow").touch()
    env = rs.StreamEnvironment(
        # no periodic checkpoint: the end-of-input entry is committed by the final one
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=600, storage=str(tmp_path / "c")),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1), stop_timeout_s=5)
    env.from_sequence(N, lambda i: {"i": i}, batch_size=100) \
        .sink_exactly_once(RowsWriter(), EntryCommitter(str(out)), name="entries")
    result = env.execute("final-commit")
    assert not (out / "_slow").exists(), "the slow commit happened"
    assert result.restarts == 1 and "did not stop within 5 s" in result.failures[0], result.failures
    committed = []
    for name in os.listdir(out):
        if name.endswith(".json"):
            committed += [r for c in json.loads((out / name).read_text()) for r in c["rows"]]
    assert np.array_equal(np.sort(committed), np.arange(N))  # each row committed once
