"""Cumulating event-time windows (``rs.CumulativeEventTimeWindows``, Flink's CUMULATE)
against pandas oracles built from the definition (tests/support/oracles.py's
``windows_of``): every window function (built-in aggregates, raw rows and pre-aggregated
panes; a user ``AggregateFunction``; a ``ProcessWindowFunction``) on both state backends
over disordered input with rows beyond the watermark's bound, with and without allowed
lateness; a row late for the small windows of its cumulation counts in its large ones.
Jobs on Ray run through a subtask kill on disk and a savepoint restored at another
parallelism on either backend; snapshots restored at other parallelisms (and across
backends) by every window function are among tests/test_windows.py's ``RESTORES``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.engine.keys import KeySelector
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.functions import BuiltinAggregates
from raystream.engine.windows.operator import WindowOperator
from raystream.engine.windows.pre_aggregate import WindowPreAggregator
from tests.support.disk import stored_entries
from tests.support.functions import AGGS
from tests.support.inputs import make_input, user_events
from tests.support.jobs import disk_env, rescaled_run, run_through_a_kill
from tests.support.operators import (MAXP, drive,
                                     last_per_window, normalized, sorted_rows, user_operator,
                                     window_operator)
from tests.support.oracles import aggregates_in_windows, kept_in_windows, windows_of
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

CUMULATE = [rs.CumulativeEventTimeWindows(max_size_ms=60, step_ms=20),
            rs.CumulativeEventTimeWindows(max_size_ms=50, step_ms=10, offset_ms=7)]
BACKENDS = [StateBackend.HEAP, StateBackend.DISK]
WINDOW = ["k", "window_start", "window_end"]


@pytest.mark.parametrize("assigner", [*CUMULATE, rs.CumulativeEventTimeWindows(10, 10),
                                      rs.CumulativeEventTimeWindows(30, 10, offset_ms=-12_345)],
                         ids=repr)
def test_assignment_is_the_definitions(assigner):
    """Each row in exactly the windows of its cumulation that end after it, by their real
    bounds, negative times and offsets too."""
    ts = np.random.default_rng(0).integers(-10 ** 6, 10 ** 6, 3000)
    rows, starts = assigner.assign(ts)
    got = sorted(zip(rows.tolist(), assigner.start_of(starts).tolist(),
                     assigner.end_of(starts).tolist()))
    assert got == sorted((row, *window) for row, t in enumerate(ts.tolist())
                         for window in windows_of(assigner, t))


def check_aggregates(out: pd.DataFrame, late: pd.DataFrame, assigner, lateness: int, key, ts,
                     x, arrival) -> None:
    """The last result per window equals pandas' aggregates of the rows it keeps; the
    rows no window keeps are the late ones."""
    expected, expected_late = aggregates_in_windows(assigner, lateness, key, ts, x, arrival)
    assert len(expected_late), "the input must hold rows beyond the bound to mean something"
    got = last_per_window(out).sort_values(WINDOW).reset_index(drop=True)  # ends share starts
    assert got[[*WINDOW, "n"]].astype(np.int64).equals(expected[[*WINDOW, "n"]].astype(np.int64))
    for column in ("total", "low", "high", "avg"):
        np.testing.assert_allclose(got[column], expected[column])
    assert sorted(late["ts"].tolist()) == sorted(expected_late["ts"].tolist())
    if lateness == 0:
        assert len(out) == len(expected)  # each window fires once


def partly_late(assigner, lateness: int, ts, arrival) -> int:
    """Rows late for some windows of their cumulation but kept by others."""
    rows = pd.DataFrame({"ts": ts, "wm": arrival})
    kept = kept_in_windows(assigner, lateness, rows).groupby(level=0).size()
    of = pd.Series([len(windows_of(assigner, t)) for t in ts.tolist()])
    return int(((kept.reindex(of.index, fill_value=0) > 0) & (kept.reindex(of.index) < of)).sum())


@pytest.mark.parametrize("assigner", CUMULATE, ids=repr)
@pytest.mark.parametrize("lateness", [0, 25])
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_cumulating_aggregates_equal_pandas(backend, assigner, lateness):
    key, ts, x = make_input(seed=lateness + assigner.step_ms, n=600, keys=40, disorder=100)
    op = window_operator(backend, assigner, lateness=lateness)
    out, arrival, late = drive(op, key, ts, x)
    assert partly_late(assigner, lateness, ts, arrival), "no row late for its small windows only"
    check_aggregates(out, late, assigner, lateness, key, ts, x, arrival)
    # a window's start is its cumulation's, shared by its windows of every size
    starts = out["window_start"] - assigner.offset_ms
    assert (starts % assigner.max_size_ms == 0).all()
    assert set((out["window_end"] - out["window_start"]).tolist()) == set(
        range(assigner.step_ms, assigner.max_size_ms + 1, assigner.step_ms))
    if backend is StateBackend.DISK:
        assert stored_entries(op) == 0  # every window deleted


@pytest.mark.parametrize("lateness", [0, 25])
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_pre_aggregated_panes_give_what_raw_rows_give(backend, lateness):
    """Partials per step-long pane (the pre-aggregator's), each merged into the windows of
    its cumulation that hold it, equal the oracle: a pane is late for a window as its
    rows are."""
    assigner = CUMULATE[1]
    key, ts, x = make_input(seed=9, n=600, keys=40, disorder=100)
    spec = AggregateSpec.of(AGGS)
    pre = WindowPreAggregator("pre", ["k"], assigner, timestamp="ts", spec=spec)
    pre.setup(RuntimeContext.local(), partials := CollectingOutput())
    op = WindowOperator("w", KeySelector.of("k"), assigner, function=BuiltinAggregates(spec),
                        timestamp="ts", allowed_lateness_ms=lateness, partial_input=True)
    op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
             out := CollectingOutput())
    op.initialize_state(None)
    wm, seen, arrival, sent = rs.MIN_WATERMARK, -(2 ** 62), [], 0
    for i in range(0, len(ts), 25):  # as tests/support/operators.feed, through the panes
        sl = slice(i, i + 25)
        pre.process_batch(pa.record_batch({"k": key[sl], "ts": ts[sl], "x": x[sl]}))
        pre.flush()
        for batch in partials.batches[sent:]:
            op.process_batch(batch)
        sent = len(partials.batches)
        arrival += [wm] * len(ts[sl])
        seen = max(seen, int(ts[sl].max()))
        if seen - 21 > wm:
            wm = seen - 21
            op.process_watermark(wm)
    op.process_watermark(rs.MAX_WATERMARK)
    expected, expected_late = aggregates_in_windows(assigner, lateness, key, ts, x, arrival)
    got = last_per_window(pa.Table.from_batches(out.batches).to_pandas())
    assert len(expected_late) and partly_late(assigner, lateness, ts, arrival)
    pd.testing.assert_frame_equal(sorted_rows(got), sorted_rows(expected), check_dtype=False)
    assert op.late_dropped > 0  # late panes, dropped (partials have no late output)


def user_oracle(kind: str, assigner, lateness: int, key, ts, x, arrival) -> pd.DataFrame:
    """pandas: the rows and the average (``aggregate``) or spread (``process``) of ``x``
    per window, of the rows each window keeps, as tests/support/operators.normalized."""
    kept = kept_in_windows(assigner, lateness,
                           pd.DataFrame({"k": key, "ts": ts, "x": x, "wm": arrival}))
    value = ("x", "mean") if kind == "aggregate" else ("x", lambda v: v.max() - v.min())
    frame = kept.groupby(WINDOW).agg(rows=("x", "size"), value=value).reset_index()
    return normalized(frame)


@pytest.mark.parametrize("kind", ["aggregate", "process"])
@pytest.mark.parametrize("lateness", [0, 25])
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_cumulating_user_functions_equal_pandas(backend, kind, lateness):
    """A user function sees a window's real bounds (``Window(start, end)``) and rows."""
    assigner = CUMULATE[0]
    key, ts, x = make_input(seed=5 + lateness, n=400, keys=20, disorder=100)
    out, arrival, late = drive(user_operator(backend, assigner, kind, lateness=lateness),
                               key, ts, x)
    expected = user_oracle(kind, assigner, lateness, key, ts, x, arrival)
    got = normalized(last_per_window(out))
    pd.testing.assert_frame_equal(got, expected)
    _, expected_late = aggregates_in_windows(assigner, lateness, key, ts, x, arrival)
    assert len(late) == len(expected_late) > 0


def test_max_size_must_be_a_multiple_of_the_step_and_joins_refuse_them():
    with pytest.raises(ValueError, match=r"max_size_ms \(25\) must be a multiple of step_ms"):
        rs.CumulativeEventTimeWindows(max_size_ms=25, step_ms=10)
    with pytest.raises(ValueError, match="step_ms must be a positive number"):
        rs.CumulativeEventTimeWindows(max_size_ms=20, step_ms=0)
    env = rs.StreamEnvironment(parallelism=1)
    a = env.from_collection([{"k": 1, "ts": 1}])
    b = env.from_collection([{"k": 1, "ts": 2}])
    with pytest.raises(ValueError, match="cumulating windows cannot join"):
        a.join(b).where("k").equal_to("k").window(
            rs.CumulativeEventTimeWindows(max_size_ms=20, step_ms=10), timestamp="ts").join()


# -- jobs on Ray -------------------------------------------------------------------------------

JOB_WINDOWS = rs.CumulativeEventTimeWindows(max_size_ms=1000, step_ms=250)


def straggling_events(i: np.ndarray) -> dict:
    """tests/support/inputs.user_events (out of order within the 500 ms bound), except
    every 500th record after the first 1000 is a minute late: late for every window under
    any interleaving of the subtasks, read as one split (by one source subtask, whose
    watermarks precede them)."""
    events = user_events(i)
    events["ts"] = events["ts"] - np.where(stragglers(i), 60_000, 0)
    return events


def stragglers(i: np.ndarray) -> np.ndarray:
    return (i % 500 == 499) & (i > 1000)


def job_oracle(n: int) -> pd.DataFrame:
    """pandas: rows ``n`` and sum ``total`` of ``x`` per (user, window) of the rows that
    are not a minute late."""
    i = np.arange(n)
    events = pd.DataFrame(straggling_events(i))[~stragglers(i)]
    events["window"] = [windows_of(JOB_WINDOWS, t) for t in events["ts"].tolist()]
    events = events.explode("window")
    events["window_start"] = [w[0] for w in events["window"]]
    events["window_end"] = [w[1] for w in events["window"]]
    return job_rows(events.groupby(["user", "window_start", "window_end"]).agg(
        n=("x", "size"), total=("x", "sum")).reset_index())


def job_rows(frame: pd.DataFrame) -> pd.DataFrame:
    columns = ["user", "window_start", "window_end", "n", "total"]
    return (frame[columns].astype({"n": np.int64, "total": np.float64})
            .sort_values(columns[:3]).reset_index(drop=True))


def check_job(table: pa.Table, n: int) -> None:
    got = job_rows(table.to_pandas())
    assert not got.duplicated(["user", "window_start", "window_end"]).any()  # each once
    pd.testing.assert_frame_equal(got, job_oracle(n))


@pytest.mark.parametrize("pre_aggregate", [False, True], ids=["rows", "panes"])
def test_cumulating_windows_on_disk_exactly_once_through_a_subtask_kill(ray_session, tmp_path,
                                                                       pre_aggregate):
    n = 20_000
    env = disk_env(str(tmp_path / "chk"))
    src = env.from_sequence(n, straggling_events, batch_size=250, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    sink = src.map_batches(throttle, name="throttle").key_by("user").window(
        JOB_WINDOWS, timestamp="ts", pre_aggregate=pre_aggregate).agg(
        n=("count", None), total=("sum", "x")).collect()
    job = run_through_a_kill(env, "cumulate-kill", "window")
    check_job(job.table(sink), n)  # the stragglers in no window (metrics restart with a subtask)


@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_open_cumulations_survive_a_savepoint_and_a_rescale(ray_session, tmp_path, backend):
    """Stopped with a savepoint at parallelism 2 while cumulations are open, with allowed
    lateness (cleanup timers in the savepoint too), restored at 3: every window fires
    exactly once over the two runs."""
    n = 20_000

    def job(parallelism: int):
        env = rs.StreamEnvironment(
            parallelism=parallelism,
            checkpoints=rs.CheckpointConfig(interval_s=0.2,
                                            storage=str(tmp_path / f"chk{parallelism}"),
                                            state_backend=backend))
        src = env.from_sequence(n, straggling_events, batch_size=250, num_splits=1,
                                watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
        if parallelism == 2:  # the first run, stopped midway
            src = src.map_batches(throttle, name="throttle")
        windowed = src.key_by("user").window(JOB_WINDOWS, timestamp="ts",
                                             allowed_lateness_ms=300).agg(
            n=("count", None), total=("sum", "x"))
        return env, windowed.collect()

    check_job(rescaled_run(job, tmp_path, f"cumulate-{backend}"), n)
