"""Dense windows on the disk state backend: partials in RocksDB, against pandas.

Operator-level tests drive a heap and a disk :class:`WindowOperator` with the same
batches and watermarks (disorder, rows beyond the bound, allowed lateness) and
check both against a pandas oracle; a restored disk operator fires from the watermark
alone; a job test runs a real Ray job on the disk backend through a subtask kill. On
either backend, in tests/test_windows.py: snapshots restored at other parallelisms (and
heap snapshots into disk), a savepoint restored at another parallelism, and rows beyond
the bound sent to the side output.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.disk_state import DiskKeyedStateBackend
from raystream.checkpoint.state_backend import StateBackend
from raystream.engine.keys import KeySelector
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.disk_panes import STATE_NAME, DiskPanes
from raystream.engine.windows.disk_sessions import DiskSessions
from raystream.engine.windows.functions import BuiltinAggregates, UserAggregate
from raystream.engine.windows import dense as dense_module
from raystream.engine.windows.dense import DiskDenseWindows
from raystream.engine.windows.generic import DiskGenericWindows
from raystream.engine.windows.session_windows import DiskSessionWindows
from raystream.engine.windows.operator import WindowOperator
from raystream.timers.disk_service import DiskTimerService
from tests.support.disk import stored_entries
from tests.support.functions import AGGS, Average
from tests.support.inputs import make_input, user_events
from tests.support.jobs import disk_env, run_through_a_kill
from tests.support.operators import (MAXP, drive, last_per_window, snapshot_midway,
                                     sorted_rows, window_operator)
from tests.support.oracles import (aggregates_in_windows, user_window_rows, user_window_sums,
                                   windows_of)
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

ASSIGNERS = [rs.TumblingEventTimeWindows(size_ms=50),
             rs.TumblingEventTimeWindows(size_ms=40, offset_ms=7),
             rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20)]


@pytest.mark.parametrize("assigner", ASSIGNERS, ids=repr)
@pytest.mark.parametrize("lateness", [0, 25])
def test_disk_windows_equal_heap_windows_and_pandas(assigner, lateness):
    key, ts, x = make_input(seed=lateness + assigner.size_ms, n=600, keys=40, disorder=100)
    heap, heap_arrival, heap_late = drive(window_operator(StateBackend.HEAP, assigner,
                                                          lateness=lateness), key, ts, x)
    op = window_operator(StateBackend.DISK, assigner, lateness=lateness)
    disk, arrival, late = drive(op, key, ts, x)
    store = op.store
    assert isinstance(store, DiskDenseWindows)  # nothing on the heap
    assert stored_entries(op) == 0 and not store.panes.timed  # every window deleted
    # the same rows (re-firings included) as the heap backend, in any order
    columns = ["k", "window_start", "window_end", *AGGS]
    pd.testing.assert_frame_equal(
        disk[columns].sort_values(columns).reset_index(drop=True),
        heap[columns].sort_values(columns).reset_index(drop=True))
    assert arrival == heap_arrival
    pd.testing.assert_frame_equal(late.sort_values("ts").reset_index(drop=True),
                                  heap_late.sort_values("ts").reset_index(drop=True))

    expected, expected_late = aggregates_in_windows(assigner, lateness, key, ts, x, arrival)
    assert len(expected_late), "the input must hold rows beyond the bound to mean something"
    got = last_per_window(disk)
    assert got[["k", "window_start", "window_end", "n"]].astype(np.int64).equals(
        expected[["k", "window_start", "window_end", "n"]].astype(np.int64))
    for column in ("total", "low", "high", "avg"):
        np.testing.assert_allclose(got[column], expected[column])
    assert sorted(late["ts"].tolist()) == sorted(expected_late["ts"].tolist())
    if lateness == 0:
        assert len(disk) == len(expected)  # each window fires once


def test_picking_aggregates_on_disk_equal_the_heap_and_pandas():
    """max_by and top_k: their partials are fixed-width slots too."""
    aggs = {"best": ("max_by", ("x", "y")), "top": ("top_k", ("x", 3))}
    key, ts, x = make_input(seed=2, n=500, keys=30, disorder=50)
    y = (np.arange(len(x)) * 7919 % 13).astype(np.float64)  # ties: the smallest x wins
    outputs = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = WindowOperator("w", KeySelector.of("k"), ASSIGNERS[2],
                            function=BuiltinAggregates(AggregateSpec.of(aggs)), timestamp="ts")
        op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
                 CollectingOutput())
        op.initialize_state(None)
        for i in range(0, len(ts), 50):
            sl = slice(i, i + 50)
            op.process_batch(pa.record_batch({"k": key[sl], "ts": ts[sl], "x": x[sl], "y": y[sl]}))
        op.process_watermark(rs.MAX_WATERMARK)  # no row is late: the oracle needs no watermark
        outputs[backend] = (pa.Table.from_batches(op.output.batches)  # pyright: ignore
                            .to_pandas().sort_values(["k", "window_start"]).reset_index(drop=True))
    heap, disk = outputs[StateBackend.HEAP], outputs[StateBackend.DISK]
    assert heap.drop(columns="top").equals(disk.drop(columns="top"))
    assert [list(t) for t in heap["top"]] == [list(t) for t in disk["top"]]
    rows = pd.DataFrame({"k": key, "ts": ts, "x": x, "y": y})
    rows["window"] = [windows_of(ASSIGNERS[2], t) for t in ts.tolist()]
    rows = rows.explode("window")
    rows["window_start"] = [w[0] for w in rows["window"]]
    expected = []
    for window, group in rows.groupby(["k", "window_start"]):
        tied = group[group["y"] == group["y"].max()]
        expected.append((*window, tied["x"].min(), sorted(group["x"], reverse=True)[:3]))  # pyright: ignore[reportGeneralTypeIssues]
    got = [(r.k, r.window_start, r.best, list(r.top)) for r in disk.itertuples()]
    assert got == expected


def test_partials_that_are_not_fixed_width_are_refused_naming_the_window(disk_backend):
    """Dense panes and sessions keep fixed-width records: object partials are refused
    with the operator's name, their types and the way out (the heap backend)."""
    timers = DiskTimerService(disk_backend)
    spec = AggregateSpec.of({"n": ("count", None)})
    refused = (r"window 'w': partials of type object, int64 cannot be kept in the disk "
               r"state backend \(fixed-width numeric partials only\); run this job with "
               r"CheckpointConfig\(state_backend='heap'\)")
    panes = DiskPanes(disk_backend, spec, timers, where="window 'w'")
    with pytest.raises(ValueError, match=refused):
        panes.set_dtypes({"__o": np.dtype(object), "__n.n": np.dtype(np.int64)})
    assert panes.record is None and disk_backend.state_kind(STATE_NAME) is None
    sessions = DiskSessions(disk_backend, spec, timers, where="window 'w'")
    kids = timers.key_ids(["a"], np.array([1]))
    with pytest.raises(ValueError, match=refused):
        sessions.merge(sessions.load(kids), kids, np.array([0]), np.array([10]),
                       {"__o": np.array([None], dtype=object), "__n.n": np.array([1])})
    assert sessions.record is None


def test_a_key_group_cleared_alone_leaves_the_others_of_its_window(disk_backend):
    """A window cleared in one key group (timers of groups fire apart after a restore):
    the other groups keep their partials, and a key of the cleared group starts anew."""
    timers = DiskTimerService(disk_backend)
    panes = DiskPanes(disk_backend, AggregateSpec.of({"total": ("sum", "x")}), timers, where="w")
    panes.set_dtypes({"__total.sum": np.dtype(np.float64)})
    keys = list(range(200))
    groups = np.array([rs.key_group_of(k, MAXP) for k in keys])
    kids = timers.key_ids(keys, groups)
    ones = {"__total.sum": np.ones(len(keys))}
    for _ in range(2):
        panes.merge(np.full(len(keys), 100), kids, ones)
    cleared = np.unique(groups)[:5]
    panes.clear(100, cleared.tolist())
    panes.merge(np.full(len(keys), 100), kids, ones)
    found, partials = panes.read(100, np.unique(groups).tolist())
    expected = pd.Series(np.where(np.isin(groups, cleared), 1.0, 3.0), index=kids)
    got = pd.Series(partials["__total.sum"], index=found).sort_index()
    pd.testing.assert_series_equal(got, expected.sort_index())


@pytest.mark.parametrize("layout", ["sessions", "generic"])
def test_sessions_and_user_functions_give_the_heap_results_in_a_disk_job(layout):
    """Not the dense layout: sessions keep their open sessions in RocksDB
    (tests/test_disk_session_windows.py), user-function windows their accumulators
    (tests/test_disk_user_windows.py); either way the heap job's results."""
    key, ts, x = make_input(seed=9, n=400, keys=20, disorder=60)
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        if layout == "sessions":
            assigner, function = (rs.EventTimeSessionWindows(gap_ms=15),
                                  BuiltinAggregates(AggregateSpec.of(AGGS)))
        else:
            assigner, function = (ASSIGNERS[2],
                                  UserAggregate(Average(), "result"))  # pyright: ignore[reportArgumentType]
        op = WindowOperator("w", KeySelector.of("k"), assigner, function=function,
                            timestamp="ts", allowed_lateness_ms=10, late_output="late")
        op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
                 CollectingOutput())
        rows, _, late = drive(op, key, ts, x)
        assert not isinstance(op.store, DiskDenseWindows)
        assert isinstance(op.store, DiskSessionWindows) == (layout == "sessions"
                                                            and backend is StateBackend.DISK)
        assert isinstance(op.store, DiskGenericWindows) == (layout == "generic"
                                                            and backend is StateBackend.DISK)
        assert not getattr(op.store, "entries", None)  # nothing left on the heap (nor, on disk, ever put there)
        outputs.append((rows.astype(str).sort_values(list(rows.columns)).reset_index(drop=True),
                        sorted(late["ts"].tolist())))
    assert len(outputs[0][0])
    pd.testing.assert_frame_equal(outputs[0][0], outputs[1][0])
    assert outputs[0][1] == outputs[1][1]


@pytest.mark.parametrize("assigner", [rs.TumblingEventTimeWindows(size_ms=4000),
                                      rs.SlidingEventTimeWindows(size_ms=4000, slide_ms=2000)],
                         ids=repr)
def test_disk_windows_of_many_keys_fire_in_bounded_chunks(assigner, monkeypatch):
    """A window whose keys all end at once is read key group by key group and emitted in
    chunks of about FIRING_CHUNK_ROWS rows (here 40): no output batch holds more than the
    chunk plus one key group's keys, and the results are the heap backend's and pandas'."""
    monkeypatch.setattr(dense_module, "FIRING_CHUNK_ROWS", 40)
    key, ts, x = make_input(seed=11, n=3000, keys=900, disorder=100)
    ts[1500::97] -= 5000  # stragglers far beyond the bound: late for every window
    heap, heap_arrival, heap_late = drive(window_operator(StateBackend.HEAP, assigner),
                                          key, ts, x)
    op = window_operator(StateBackend.DISK, assigner)
    disk, arrival, late = drive(op, key, ts, x)
    assert isinstance(op.store, DiskDenseWindows) and stored_entries(op) == 0
    batches = [b.num_rows for b in op.output.batches]  # pyright: ignore[reportAttributeAccessIssue]
    groups = pd.Series([rs.key_group_of(k, MAXP) for k in key.tolist()])
    per_group = groups.groupby(groups).size().max()  # at most this many keys in a key group
    assert max(batches) <= 40 + per_group and len(batches) > len(disk) // (40 + per_group)
    columns = ["k", "window_start", "window_end", *AGGS]
    pd.testing.assert_frame_equal(
        disk[columns].sort_values(columns).reset_index(drop=True),
        heap[columns].sort_values(columns).reset_index(drop=True))
    assert arrival == heap_arrival
    expected, expected_late = aggregates_in_windows(assigner, 0, key, ts, x, arrival)
    assert len(expected_late), "the input must hold rows beyond the bound to mean something"
    got = disk.sort_values(["k", "window_start"]).reset_index(drop=True)
    assert got[["k", "window_start", "window_end", "n"]].astype(np.int64).equals(
        expected[["k", "window_start", "window_end", "n"]].astype(np.int64))
    for column in ("total", "low", "high", "avg"):
        np.testing.assert_allclose(got[column], expected[column])
    assert sorted(late["ts"].tolist()) == sorted(expected_late["ts"].tolist())
    assert sorted(heap_late["ts"].tolist()) == sorted(expected_late["ts"].tolist())


def test_processing_time_windows_on_disk_fire_at_the_end():
    op = WindowOperator("w", KeySelector.of("k"), rs.TumblingProcessingTimeWindows(size_ms=3_600_000),
                        function=BuiltinAggregates(AggregateSpec.of({"n": ("count", None),
                                                                     "total": ("sum", "x")})),
                        timestamp=None)
    op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=StateBackend.DISK),
             CollectingOutput())
    op.initialize_state(None)
    key, _, x = make_input(seed=1, n=300, keys=30)
    for i in range(0, 300, 50):
        op.process_batch(pa.record_batch({"k": key[i:i + 50], "x": x[i:i + 50]}))
    assert stored_entries(op) > 0
    op.finish()
    got = pa.Table.from_batches(op.output.batches).to_pandas()  # pyright: ignore
    expected = pd.DataFrame({"k": key, "x": x}).groupby("k")["x"].agg(["size", "sum"])
    assert len(got["window_start"].unique()) <= 2  # an hour's window (or two, at its edge)
    by_key = got.groupby("k").agg(n=("n", "sum"), total=("total", "sum"))
    assert by_key["n"].tolist() == expected["size"].tolist()
    np.testing.assert_allclose(by_key["total"], expected["sum"])
    assert stored_entries(op) == 0


def test_restored_panes_know_their_record_before_any_row():
    """A restored disk operator fires its windows from the watermark alone: the partials'
    dtypes come with the state's kind, the keys from the entries."""
    assigner = ASSIGNERS[0]
    key, ts, x = make_input(seed=4, n=200, keys=25, disorder=0)
    sections, whole = snapshot_midway(StateBackend.DISK, assigner, key, ts, x, len(ts))
    op = window_operator(StateBackend.DISK, assigner)
    op.initialize_state(RestoredState(1, [], list(sections.items()), None))
    assert isinstance(op.backend, DiskKeyedStateBackend)
    assert str(op.backend.state_kind(STATE_NAME)).startswith("window-panes ")
    op.process_watermark(rs.MAX_WATERMARK)
    got = pa.Table.from_batches(op.output.batches).to_pandas()  # pyright: ignore
    snapshot_watermark = int(ts.max()) - 100
    pd.testing.assert_frame_equal(
        sorted_rows(got), sorted_rows(whole[whole["window_end"] - 1 > snapshot_watermark]))


# -- jobs on Ray ----------------------------------------------------------------------------

@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_windows_exactly_once_through_a_subtask_kill(ray_session, tmp_path, incremental):
    """Full checkpoints with raw rows in; incremental ones with pre-aggregated partials in."""
    n, size = 40_000, 1000
    env = disk_env(str(tmp_path / "chk"), incremental=incremental)
    src = env.from_sequence(n, user_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    sink = src.map_batches(throttle, name="throttle").key_by("user").window(
        rs.TumblingEventTimeWindows(size_ms=size), timestamp="ts",
        pre_aggregate=incremental).agg(
        n=("count", None), total=("sum", "x")).collect()
    job = run_through_a_kill(env, "disk-windows-kill", "window")
    got = user_window_rows(job.table(sink))
    assert not got.duplicated(["user", "window_start"]).any()  # no window emitted twice
    pd.testing.assert_frame_equal(got, user_window_sums(user_events, n, size), check_dtype=False)
