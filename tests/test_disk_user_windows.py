"""Tumbling and sliding windows of user functions on the disk state backend, against pandas.

A user ``AggregateFunction`` and a ``ProcessWindowFunction`` keep their (key, window)
accumulators in RocksDB (:mod:`raystream.engine.windows.disk_entries`). Operator-level
tests drive a heap and a disk :class:`WindowOperator` with the same batches and
watermarks (disorder, allowed lateness, a late side output) and check both against a
pandas oracle; a real Ray job runs through a subtask kill with incremental checkpoints.
Snapshots restored at parallelisms 1, 2 and 3, a heap snapshot into a disk job and disk
sections into a heap job are in tests/test_windows.py, over both backends.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.engine.keys import KeySelector
from raystream.engine.windows.generic import DiskGenericWindows
from raystream.engine.windows.operator import WindowOperator
from tests.support.disk import stored_entries
from tests.support.functions import Average
from tests.support.inputs import make_input, user_events
from tests.support.jobs import disk_env, run_through_a_kill
from tests.support.operators import (MAXP, drive, function_of, last_per_window, normalized,
                                     user_operator)
from tests.support.oracles import kept_in_windows
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

ASSIGNERS = [rs.TumblingEventTimeWindows(size_ms=50),
             rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20)]
KINDS = ["aggregate", "process"]


def oracle(assigner, kind: str, lateness: int, key, ts, x, arrival):
    """pandas: each row in every window it belongs to unless that window was past its
    lateness when the row arrived; rows kept by no window are the late ones."""
    rows = pd.DataFrame({"k": key, "ts": ts, "x": x, "wm": arrival})
    kept = kept_in_windows(assigner, lateness, rows)
    grouped = kept.groupby(["k", "window_start", "window_end"])["x"]
    value = (grouped.mean() if kind == "aggregate"
             else grouped.max().to_numpy() - grouped.min().to_numpy())
    results = pd.DataFrame({"rows": grouped.size(), "value": value}).reset_index()
    late = rows.loc[~rows.index.isin(kept.index), "ts"]
    return normalized(results), sorted(late.tolist())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("assigner", ASSIGNERS, ids=repr)
@pytest.mark.parametrize("lateness", [0, 25])
def test_disk_user_windows_equal_heap_and_pandas(kind, assigner, lateness):
    key, ts, x = make_input(seed=lateness + assigner.size_ms, n=500, keys=30, disorder=100)
    heap, heap_arrival, heap_late = drive(
        user_operator(StateBackend.HEAP, assigner, kind, lateness=lateness), key, ts, x)
    op = user_operator(StateBackend.DISK, assigner, kind, lateness=lateness)
    disk, arrival, late = drive(op, key, ts, x)
    assert isinstance(op.store, DiskGenericWindows) and not getattr(op.store, "entries", None)  # nothing on the heap
    assert stored_entries(op) == 0  # every window deleted past its lateness
    # the same rows (re-firings included, in the same order) as the heap backend
    pd.testing.assert_frame_equal(disk, heap)
    assert arrival == heap_arrival
    pd.testing.assert_frame_equal(late, heap_late)

    expected, expected_late = oracle(assigner, kind, lateness, key, ts, x, arrival)
    assert len(expected_late), "the input must hold rows beyond the bound to mean something"
    if lateness:
        assert len(disk) > len(expected)  # some windows fired again
    pd.testing.assert_frame_equal(normalized(last_per_window(disk)), expected)
    assert sorted(late["ts"].tolist()) == expected_late


def test_processing_time_user_windows_on_disk_fire_at_the_end():
    op = WindowOperator("w", KeySelector.of("k"),
                        rs.TumblingProcessingTimeWindows(size_ms=3_600_000),
                        function=function_of("aggregate"), timestamp=None)
    op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=StateBackend.DISK),
             CollectingOutput())
    op.initialize_state(None)
    key, _, x = make_input(seed=1, n=300, keys=30)
    for i in range(0, 300, 50):
        op.process_batch(pa.record_batch({"k": key[i:i + 50], "x": x[i:i + 50]}))
    assert stored_entries(op) > 0 and not getattr(op.store, "entries", None)
    op.finish()
    got = pa.Table.from_batches(op.output.batches).to_pandas()  # pyright: ignore
    assert len(got["window_start"].unique()) <= 2  # an hour's window (or two, at its edge)
    got = got.assign(total=got["avg"] * got["rows"]).groupby("k").agg(
        rows=("rows", "sum"), total=("total", "sum"))
    expected = pd.DataFrame({"k": key, "x": x}).groupby("k")["x"].agg(["size", "sum"])
    assert got["rows"].tolist() == expected["size"].tolist()
    np.testing.assert_allclose(got["total"], expected["sum"], atol=1e-9)
    assert stored_entries(op) == 0


# -- a job on Ray -----------------------------------------------------------------------------

@pytest.mark.slow
def test_disk_user_windows_exactly_once_through_a_subtask_kill(ray_session, tmp_path):
    """A user AggregateFunction over tumbling windows, incremental checkpoints, one
    subtask killed: every window's result exactly once."""
    n, size = 30_000, 1000
    env = disk_env(str(tmp_path / "chk"), incremental=True)
    src = env.from_sequence(n, user_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    sink = src.map_batches(throttle, name="throttle").key_by("user").window(
        rs.TumblingEventTimeWindows(size_ms=size), timestamp="ts").aggregate(
        Average()).collect()  # pyright: ignore[reportArgumentType]
    job = run_through_a_kill(env, "disk-user-windows-kill", "window")
    got = (job.table(sink).to_pandas()[["user", "window_start", "rows", "avg"]]
           .sort_values(["user", "window_start"]).reset_index(drop=True))
    assert not got.duplicated(["user", "window_start"]).any()  # no window emitted twice
    e = pd.DataFrame(user_events(np.arange(n)))
    e["window_start"] = e["ts"] // size * size
    expected = (e.groupby(["user", "window_start"]).agg(rows=("x", "size"), avg=("x", "mean"))
                .reset_index().sort_values(["user", "window_start"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
