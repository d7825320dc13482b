"""Windows: every assigner and function against a plain-Python/numpy oracle.

Operator-level tests drive a :class:`WindowOperator` by hand with an explicit
sequence of batches and watermarks (so lateness is exact); job-level tests
run real jobs on Ray, with pre-aggregation, side outputs and placed failures; the
late side output and the savepoint restored at another parallelism on either state
backend (heap and disk).
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import ray

import raystream as rs
from raystream.checkpoint.envelope import is_keyed_state
from raystream.checkpoint.sections import decode_parts
from raystream.checkpoint.state_backend import StateBackend
from raystream.engine.keys import KeySelector
from raystream.actors.operator import CollectingOutput, RuntimeContext
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.functions import BuiltinAggregates, ProcessWindow, UserAggregate
from raystream.engine.windows.operator import WindowOperator
from raystream.engine.windows.pre_aggregate import WindowPreAggregator
from tests.support.functions import AGGS, Average, Spread
from tests.support.inputs import BASE, make_input, user_events, with_stragglers
from tests.support.jobs import disk_env, rescaled_run, wait_for_checkpoint
from tests.support.operators import (check_restores_at_other_parallelism, feed, normalized,
                                     sorted_rows, user_operator, window_operator)
from tests.support.oracles import user_window_rows, user_window_sums, windows_of
from tests.support.pacing import Throttle

def aggregate_oracle(values: list[float]) -> dict:
    xs = [v for v in values if v is not None]
    return {"n": len(values), "total": sum(xs), "low": min(xs) if xs else None,
            "high": max(xs) if xs else None, "avg": (sum(xs) / len(xs)) if xs else None}


def drive(op, key, ts, x, *, batch=25, lag=20, late_tag="late"):
    """Feed batches; after each, the watermark is max(ts seen) - lag - 1. Returns the
    output, the watermark each row saw on arrival, and the side output rows."""
    out = CollectingOutput()
    op.setup(RuntimeContext.local(), out)
    arrival = feed(op, key, ts, x, batch=batch, lag=lag)
    op.finish()
    table = pa.Table.from_batches(out.batches) if out.batches else pa.table({})
    late = (pa.Table.from_batches(out.side_batches[late_tag]).to_pylist()
            if late_tag in out.side_batches else [])
    return table, arrival, late


def last_per_window(table: pa.Table) -> dict:
    """The latest emission per (key, window): a re-fired window replaces its result."""
    result = {}
    for row in table.to_pylist():
        result[(row["k"], row["window_start"], row["window_end"])] = row
    return result


@pytest.mark.parametrize("assigner", [rs.TumblingEventTimeWindows(size_ms=50),
                                      rs.TumblingEventTimeWindows(size_ms=40, offset_ms=7),
                                      rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20)])
@pytest.mark.parametrize("lateness", [0, 25])
def test_event_time_aggregates_with_lateness_equal_oracle(assigner, lateness):
    key, ts, x = make_input(seed=lateness + assigner.size_ms, disorder=100)
    op = WindowOperator("w", KeySelector.of("k"), assigner,
                        function=BuiltinAggregates(AggregateSpec.of(AGGS)), timestamp="ts",
                        allowed_lateness_ms=lateness, late_output="late")
    table, arrival, late = drive(op, key, ts, x)

    expected, expected_late = collections.defaultdict(list), []
    for k, t, v, wm in zip(key.tolist(), ts.tolist(), x.tolist(), arrival):
        kept = [w for w in windows_of(assigner, t) if w[1] - 1 + lateness > wm]
        if not kept:
            expected_late.append({"k": k, "ts": t, "x": v})
        for start, end in kept:
            expected[(k, start, end)].append(v)
    assert expected_late, "the input must contain late rows for this test to mean something"
    got = last_per_window(table)
    assert set(got) == set(expected)
    for window, values in expected.items():
        row = got[window]
        want = aggregate_oracle(values)
        assert row["n"] == want["n"] and row["total"] == pytest.approx(want["total"])
        assert row["low"] == want["low"] and row["high"] == want["high"]
        assert row["avg"] == pytest.approx(want["avg"])
    assert sorted(late, key=str) == sorted(expected_late, key=str)
    # every window fires once on time, plus once per later batch that updated it
    assert table.num_rows >= len(expected)
    if lateness == 0:
        assert table.num_rows == len(expected)


def test_session_windows_merge_across_batches():
    rng = np.random.default_rng(7)
    n = 300
    key = rng.integers(0, 4, n)
    ts = np.sort(rng.integers(0, 3000, n))
    x = rng.integers(0, 9, n).astype(np.float64)
    order = rng.permutation(n)  # out of order, but never beyond the watermark lag
    gap = 40
    op = WindowOperator("s", KeySelector.of("k"), rs.EventTimeSessionWindows(gap_ms=gap),
                        function=BuiltinAggregates(AggregateSpec.of(AGGS)), timestamp="ts")
    table, _, late = drive(op, key[order], ts[order], x[order], lag=10_000)
    assert late == []
    expected = {}
    for k in np.unique(key).tolist():
        times, values = ts[key == k], x[key == k]
        idx = np.argsort(times, kind="stable")
        times, values = times[idx], values[idx]
        cut = np.flatnonzero(np.diff(times) > gap) + 1
        for t_part, v_part in zip(np.split(times, cut), np.split(values, cut)):
            expected[(k, int(t_part[0]), int(t_part[-1]) + gap)] = aggregate_oracle(v_part.tolist())
    got = last_per_window(table)
    assert set(got) == set(expected)
    for window, want in expected.items():
        assert got[window]["n"] == want["n"] and got[window]["total"] == want["total"]


def test_session_picking_aggregates_equal_oracle():
    """max_by and top_k over sessions (merged across batches, out of order)."""
    rng = np.random.default_rng(5)
    n = 400
    key, ts = rng.integers(0, 5, n), np.sort(rng.integers(0, 4000, n))
    x = rng.integers(0, 50, n).astype(np.float64)
    order = rng.permutation(n)
    gap = 30
    spec = AggregateSpec.of({"best": ("max_by", ("ts", "x")), "top": ("top_k", ("x", 3)),
                             "n": ("count", None)})
    op = WindowOperator("s", KeySelector.of("k"), rs.EventTimeSessionWindows(gap_ms=gap),
                        function=BuiltinAggregates(spec), timestamp="ts")
    table, _, _ = drive(op, key[order], ts[order], x[order], batch=40, lag=10_000)
    got = last_per_window(table)
    expected = {}
    for k in np.unique(key).tolist():
        mine = np.flatnonzero(key == k)  # ts is sorted
        for part in np.split(mine, np.flatnonzero(np.diff(ts[mine]) > gap) + 1):
            xs, times = x[part], ts[part]
            best = times[xs == xs.max()].min()  # ties on x: the smallest ts
            expected[(k, int(times[0]), int(times[-1]) + gap)] = (
                int(best), sorted(xs.tolist(), reverse=True)[:3], len(part))
    assert {w: (r["best"], r["top"], r["n"]) for w, r in got.items()} == expected


@pytest.mark.parametrize("seed", range(5))
def test_session_breaks_equal_a_running_union(seed):
    """Sorted intervals: a merged session starts where a new key starts or an interval
    begins after every end of its key so far (nested intervals included)."""
    from raystream.engine.windows.sessions import session_breaks

    rng = np.random.default_rng(seed)
    n = 300
    kids, starts = rng.integers(0, 4, n), rng.integers(0, 500, n)
    ends = starts + rng.integers(1, 60 if seed % 2 else 5, n)
    order = np.lexsort((starts, kids))
    kids, starts, ends = kids[order], starts[order], ends[order]
    expected, reach = [], None
    for i in range(n):
        new = i == 0 or kids[i] != kids[i - 1] or starts[i] > reach
        expected.append(bool(new))
        reach = int(ends[i]) if new else max(reach, int(ends[i]))
    assert session_breaks(kids, starts, ends).tolist() == expected


def test_sessions_of_a_version_2_checkpoint_restore_into_the_session_store():
    """Version 2 kept a session of built-in aggregates as one accumulator dict."""
    import pickle

    spec = AggregateSpec.of({"n": ("count", None), "total": ("sum", "x")})
    op = WindowOperator("s", KeySelector.of("k"), rs.EventTimeSessionWindows(gap_ms=10),
                        function=BuiltinAggregates(spec), timestamp="ts")
    out = CollectingOutput()
    op.setup(RuntimeContext.local(), out)
    op.initialize_state(None)
    op.open()
    group = rs.key_group_of(7, 128)
    blob = pickle.dumps((2, {"dense": None, "generic": [
        (7, 100, 115, {"__n.n": 3, "__total.sum": 6.0}),
        (7, 200, 210, {"__n.n": 1, "__total.sum": 1.0})]}))
    op.restore_keyed_parts({"windows": [(group, blob)]})
    # a row at 112 extends the first session to 122 (and re-registers its timer)
    op.process_batch(pa.record_batch({"k": [7], "ts": [112], "x": [4.0]}))
    op.process_watermark(150)
    assert pa.Table.from_batches(out.batches).to_pylist() == [
        {"k": 7, "window_start": 100, "window_end": 122, "n": 4, "total": 10.0}]


class SessionAggregates:
    """count, sum, min and max of ``x`` as a user AggregateFunction: its sessions take the
    per-session path of the window operator."""

    def create_accumulator(self):
        return (0, 0.0, float("inf"), float("-inf"))

    def add(self, row, acc):
        return (acc[0] + 1, acc[1] + row["x"], min(acc[2], row["x"]), max(acc[3], row["x"]))

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1], min(a[2], b[2]), max(a[3], b[3]))

    def get_result(self, acc):
        return {"n": acc[0], "total": acc[1], "low": acc[2], "high": acc[3]}


@pytest.mark.parametrize("lateness", [0, 60])
def test_columnar_sessions_emit_what_per_session_accumulators_emit(lateness):
    """Out of order, late records, allowed lateness: the columnar session store and the
    per-session path of user functions fire the same sessions with the same results, and
    drop the same records."""
    key, ts, x = make_input(seed=9, n=600, keys=6, disorder=60)
    gap = 12
    emitted = {}
    for kind in ("columnar", "per-session"):
        function = (BuiltinAggregates(AggregateSpec.of(
            {"n": ("count", None), "total": ("sum", "x"), "low": ("min", "x"),
             "high": ("max", "x")})) if kind == "columnar"
            else UserAggregate(SessionAggregates(), "result"))
        op = WindowOperator("s", KeySelector.of("k"), rs.EventTimeSessionWindows(gap_ms=gap),
                            function=function, timestamp="ts", allowed_lateness_ms=lateness,
                            late_output="late")
        table, _, late = drive(op, key, ts, x, batch=30, lag=15)
        rows = sorted((r["k"], r["window_start"], r["window_end"], r["n"], r["total"], r["low"],
                       r["high"]) for r in table.to_pylist())
        emitted[kind] = (rows, sorted(r["ts"] for r in late))
    assert emitted["columnar"] == emitted["per-session"]
    rows, late = emitted["columnar"]
    assert late and len(rows) > 50
    if lateness:  # some sessions fired again
        assert len({r[:3] for r in rows}) < len(rows)


@pytest.mark.parametrize("function", ["aggregate", "process"])
@pytest.mark.parametrize("assigner", [rs.TumblingEventTimeWindows(size_ms=50),
                                      rs.EventTimeSessionWindows(gap_ms=15)])
def test_user_functions_equal_oracle(function, assigner):
    key, ts, x = make_input(seed=3, n=200, disorder=0)
    fn = UserAggregate(Average(), "result") if function == "aggregate" else ProcessWindow(Spread())
    op = WindowOperator("u", KeySelector.of("k"), assigner, function=fn, timestamp="ts")
    table, _, late = drive(op, key, ts, x, lag=0)
    assert late == []
    groups = collections.defaultdict(list)
    for k, t, v in zip(key.tolist(), ts.tolist(), x.tolist()):
        groups[k].append((t, v))
    expected = {}
    for k, items in groups.items():
        items.sort()
        if isinstance(assigner, rs.TumblingEventTimeWindows):
            by_window = collections.defaultdict(list)
            for t, v in items:
                (w,) = windows_of(assigner, t)
                by_window[w].append(v)
            for (start, end), vs in by_window.items():
                expected[(k, start, end)] = vs
        else:
            session = [items[0]]
            for t, v in items[1:]:
                if t - session[-1][0] > assigner.gap_ms:
                    expected[(k, session[0][0], session[-1][0] + assigner.gap_ms)] = [
                        s[1] for s in session]
                    session = []
                session.append((t, v))
            expected[(k, session[0][0], session[-1][0] + assigner.gap_ms)] = [s[1] for s in session]
    got = last_per_window(table)
    assert set(got) == set(expected)
    for window, vs in expected.items():
        assert got[window]["rows"] == len(vs)
        if function == "aggregate":
            assert got[window]["avg"] == pytest.approx(sum(vs) / len(vs))
        else:
            assert got[window]["spread"] == max(vs) - min(vs)


def test_processing_time_windows_fire_on_the_clock_and_at_the_end():
    op = WindowOperator("p", KeySelector.of("k"), rs.TumblingProcessingTimeWindows(size_ms=100),
                        function=BuiltinAggregates(AggregateSpec.of({"n": ("count", None)})),
                        timestamp=None)
    out = CollectingOutput()
    op.setup(RuntimeContext.local(), out)
    op.initialize_state(None)
    op.open()
    op.process_batch(pa.record_batch({"k": [1, 2, 1]}))
    due = op.next_processing_time()
    assert due is not None
    op.on_processing_time(due)  # the clock reached the window's end - 1
    first = pa.Table.from_batches(out.batches).to_pylist()
    assert sorted((r["k"], r["n"]) for r in first) == [(1, 2), (2, 1)]
    assert all(r["window_end"] - 1 == due for r in first)
    op.process_batch(pa.record_batch({"k": [3]}))
    op.finish()  # end of input: open processing-time windows fire rather than vanish
    assert pa.Table.from_batches(out.batches).num_rows == 3


def test_dense_windows_hold_one_timer_per_key_group_and_fire_every_key():
    """A window of thousands of keys costs at most one timer per key group; a firing
    emits every key of its window once, and allowed lateness re-fires a late key and
    then clears the window."""
    max_parallelism = 128
    op = WindowOperator("d", KeySelector.of("k"), rs.TumblingEventTimeWindows(size_ms=100),
                        function=BuiltinAggregates(AggregateSpec.of({"n": ("count", None)})),
                        timestamp="ts", allowed_lateness_ms=50)
    out = CollectingOutput()
    op.setup(RuntimeContext("job", "d", 0, 1, max_parallelism, 0), out)
    op.initialize_state(None)
    rng = np.random.default_rng(3)
    key, ts = rng.integers(0, 5000, 20_000), rng.integers(0, 200, 20_000)
    for lo in range(0, len(key), 4000):
        op.process_batch(pa.record_batch({"k": key[lo:lo + 4000], "ts": ts[lo:lo + 4000]}))
    # two windows, each with a firing and a cleanup timer per key group
    assert op.timers.num_event_time_timers <= 2 * 2 * max_parallelism
    op.process_watermark(99)  # the first window fires, its state stays for lateness
    first = pa.Table.from_batches(out.batches).to_pydict()
    expected = collections.Counter(key[ts < 100].tolist())
    assert dict(zip(first["k"], first["n"])) == expected and len(first["k"]) == len(expected)
    late_key = int(key.max()) + 1  # a key the window has not seen, late within lateness
    op.process_batch(pa.record_batch({"k": [late_key], "ts": [10]}))
    assert out.batches[-1].to_pydict()["k"] == [late_key]
    op.process_watermark(149)  # cleanup of the first window: nothing fires, state goes
    assert sorted(op.store.windows) == [100]
    op.process_watermark(rs.MAX_WATERMARK)
    rest = pa.Table.from_batches(out.batches).to_pydict()
    assert len(rest["k"]) == len(expected) + 1 + len(set(key[ts >= 100].tolist()))
    assert not op.store.windows and op.timers.num_event_time_timers == 0


def test_a_dense_timer_fires_only_its_own_key_group():
    op = WindowOperator("g", KeySelector.of("k"), rs.TumblingEventTimeWindows(size_ms=100),
                        function=BuiltinAggregates(AggregateSpec.of({"n": ("count", None)})),
                        timestamp="ts")
    op.setup(RuntimeContext.local(), CollectingOutput())
    op.initialize_state(None)
    a, b = 0, next(k for k in range(1, 1000) if rs.key_group_of(k, 128) != rs.key_group_of(0, 128))
    op.process_batch(pa.record_batch({"k": [a, b], "ts": [5, 6]}))
    kid_a = op.timers.key_ids([a], np.array([rs.key_group_of(a, 128)]))
    group_a = op.timers.key_groups_of(kid_a)
    # a group named twice (two timers of one group) is still that one group
    assert op.store._keys_of_groups(0, np.repeat(group_a, 2)).tolist() == kid_a.tolist()


RESTORES = [  # (function, assigner, (seed, rows, keys) of make_input): snapshot at half the rows
    ("builtin", rs.SlidingEventTimeWindows(size_ms=60, slide_ms=30), (11, 300, 40)),
    ("aggregate", rs.SlidingEventTimeWindows(size_ms=60, slide_ms=30), (11, 300, 40)),
    ("builtin", rs.EventTimeSessionWindows(gap_ms=40), (11, 300, 40)),
    ("aggregate", rs.EventTimeSessionWindows(gap_ms=40), (11, 300, 40)),
    ("builtin", rs.EventTimeSessionWindows(gap_ms=40), (5, 400, 10)),
    ("builtin", rs.TumblingEventTimeWindows(size_ms=40, offset_ms=7), (11, 400, 60)),
    ("builtin", rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20), (11, 400, 60)),
    ("aggregate", rs.TumblingEventTimeWindows(size_ms=50), (11, 400, 60)),
    ("aggregate", rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20), (11, 400, 60)),
    ("process", rs.TumblingEventTimeWindows(size_ms=50), (11, 400, 60)),
    ("process", rs.SlidingEventTimeWindows(size_ms=60, slide_ms=20), (11, 400, 60)),
    # cumulating windows (tests/test_cumulative_windows.py): the windows of a cumulation
    # across the cut share their start
    *((function, rs.CumulativeEventTimeWindows(max_size_ms=50, step_ms=10, offset_ms=7),
       (11, 400, 30)) for function in ("builtin", "aggregate", "process")),
]


@pytest.mark.parametrize("function, assigner, data", RESTORES,
                         ids=[f"{f}-{a!r}-{d[1]}" for f, a, d in RESTORES])
@pytest.mark.parametrize("backend", [StateBackend.HEAP, StateBackend.DISK],
                         ids=lambda b: b.value)
def test_snapshot_restore_at_other_parallelism_gives_the_same_results(backend, function,
                                                                      assigner, data):
    """Snapshot mid-stream (state changing before the asynchronous part runs), restore
    into 1, 2 and 3 subtasks by key group: every window still open at the snapshot fires
    once, as in the uninterrupted run; those that fired before it do not fire again. On
    disk the state travels in the backend's sections (none a heap part of windows), a
    heap snapshot restores into disk subtasks and the disk sections into heap ones."""
    seed, n, keys = data
    key, ts, x = make_input(seed=seed, n=n, keys=keys, disorder=0)
    half = n // 2
    make = window_operator if function == "builtin" else (
        lambda backend, assigner, **at: user_operator(backend, assigner, function, **at))
    sections, open_at_snapshot = check_restores_at_other_parallelism(
        assigner, key, ts, x, half, backend=backend, make=make,
        normal=sorted_rows if function == "builtin" else normalized)
    assert (open_at_snapshot["window_start"] < ts[half]).any()  # a window across the cut
    if backend is StateBackend.DISK:
        assert not any("windows" in decode_parts(s) for s in sections.values()
                       if not is_keyed_state(s))


def test_pre_aggregation_snapshot_is_empty_and_partials_precede_the_watermark():
    spec = AggregateSpec.of(AGGS)
    pre = WindowPreAggregator("pre", ["k"], rs.TumblingEventTimeWindows(size_ms=50), timestamp="ts",
                              spec=spec, max_buffered_rows=10 ** 9)
    out = CollectingOutput()
    pre.setup(RuntimeContext.local(), out)
    key, ts, x = make_input(seed=5, n=100)
    pre.process_batch(pa.record_batch({"k": key, "ts": ts, "x": x}))
    assert out.batches == []  # buffered
    pre.prepare_snapshot_pre_barrier(1)
    assert pre.snapshot_state(1) is None and pre.buffer == []
    partials = pa.Table.from_batches(out.batches)
    assert sum(partials["__n.n"].to_pylist()) == 100
    pre.process_batch(pa.record_batch({"k": key, "ts": ts, "x": x}))
    pre.process_watermark(123)
    assert len(out.batches) == 2 and out.watermarks == [123]


# -- jobs on Ray -------------------------------------------------------------------------------

def oracle_tumbling(n: int, size: int) -> dict:
    i = np.arange(n)
    e = user_events(i)
    start = (e["ts"] // size) * size
    out = collections.defaultdict(lambda: [0, 0.0])
    for u, s, v in zip(e["user"].tolist(), start.tolist(), e["x"].tolist()):
        out[(u, s)][0] += 1
        out[(u, s)][1] += v
    return out


@pytest.mark.parametrize("pre_aggregate", [True, False])
def test_window_job_equals_oracle(ray_session, pre_aggregate):
    n, size = 20_000, 1000
    env = rs.StreamEnvironment(parallelism=2)
    src = env.from_sequence(n, user_events, watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    result = src.key_by("user").window(rs.TumblingEventTimeWindows(size_ms=size), timestamp="ts",
                                       pre_aggregate=pre_aggregate).agg(
        n=("count", None), total=("sum", "x"))
    sink = result.collect()
    job = env.execute("windows")
    got = {(r["user"], r["window_start"]): [r["n"], r["total"]]
           for r in job.table(sink).to_pylist()}
    expected = oracle_tumbling(n, size)
    assert job.table(sink).num_rows == len(expected)  # each window exactly once
    assert got == dict(expected)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_late_records_go_to_the_side_output_and_nowhere_else(ray_session, tmp_path, backend):
    n, size = 10_000, 1000
    env = (disk_env(str(tmp_path / "chk")) if backend == "disk"
           else rs.StreamEnvironment(parallelism=2))
    src = env.from_sequence(n, with_stragglers, batch_size=200, num_splits=1,  # one reader: its
                            # watermark alone decides what is late, whatever the interleaving
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=100))
    windowed = src.key_by("user").window(rs.TumblingEventTimeWindows(size_ms=size), timestamp="ts",
                                         late_output="late").agg(
        n=("count", None), total=("sum", "x"))
    main, late = windowed.collect(), windowed.side_output("late").collect(name="late")
    job = env.execute(f"late-{backend}")
    i = np.arange(n)
    straggler = (i % 500 == 499) & (i > 1000)
    late_rows = job.table(late)
    assert sorted(late_rows["ts"].to_pylist()) == sorted(with_stragglers(i)["ts"][straggler].tolist())
    pd.testing.assert_frame_equal(user_window_rows(job.table(main)),
                                  user_window_sums(with_stragglers, n, size, keep=~straggler),
                                  check_dtype=False)


throttle = Throttle(0.03)  # keeps the job running long enough to place five failures


@pytest.mark.slow
def test_windows_exactly_once_under_placed_failures(ray_session, tmp_path):
    n, size = 60_000, 1000
    failpoints = [
        rs.Failpoint("in_processing", operator="window", subtask=1, hit=40, attempt=0,
                     action="raise"),
        rs.Failpoint("in_snapshot", operator="window", subtask=0, hit=2, attempt=1),
        rs.Failpoint("right_after_restore", operator="window", subtask=0, attempt=2),
        rs.Failpoint("in_async_write", operator="window", subtask=1, hit=2, attempt=3),
    ]
    env = rs.StreamEnvironment(
        parallelism=2, failpoints=failpoints,
        checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / "chk")),
        restart=rs.RestartStrategy.fixed_delay(8, 0.1))
    src = env.from_sequence(n, user_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
    result = src.map_batches(throttle, name="throttle").key_by("user").window(
        rs.TumblingEventTimeWindows(size_ms=size), timestamp="ts").agg(
        n=("count", None), total=("sum", "x"))
    sink = result.collect()
    client = env.execute_async("windows-failover")
    deadline = time.monotonic() + 180
    while client.progress()["attempt"] < 4:
        assert time.monotonic() < deadline, client.progress()
        time.sleep(0.05)
    completed = client.progress()["completed_checkpoints"]
    wait_for_checkpoint(client, after=max(completed or [0]))
    ray.kill(client.subtask_actor("window", 0))
    job = client.wait(timeout_s=240)
    assert job.restarts == 5, job.failures
    assert "failpoint in_processing" in job.failures[0]
    assert all("died" in f for f in job.failures[1:]), job.failures
    table = job.table(sink)
    got = {(r["user"], r["window_start"]): [r["n"], r["total"]] for r in table.to_pylist()}
    assert table.num_rows == len(got)  # no window emitted twice
    assert got == dict(oracle_tumbling(n, size))


RESCALED_WINDOWS = {"tumbling": (rs.TumblingEventTimeWindows(size_ms=1000), False),
                    "sliding-pre-aggregated": (rs.SlidingEventTimeWindows(size_ms=1000,
                                                                          slide_ms=500), True)}


@pytest.mark.slow
@pytest.mark.parametrize("windows", list(RESCALED_WINDOWS))
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_open_windows_survive_a_savepoint_and_a_rescale_exactly_once(ray_session, tmp_path,
                                                                     backend, windows):
    """Stopped with a savepoint at parallelism 2 while windows are open (their state and
    their per-key-group timers in it; pre-aggregated: panes), with allowed lateness,
    restored at 3: every window fires exactly once over the two runs."""
    n = 30_000
    assigner, pre_aggregate = RESCALED_WINDOWS[windows]

    def job(parallelism: int):
        env = rs.StreamEnvironment(
            parallelism=parallelism,
            checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path / f"chk{parallelism}"),
                                            state_backend=backend))
        src = env.from_sequence(n, user_events, batch_size=250,
                                watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=500))
        if parallelism == 2:  # the first run, stopped midway; the restored one need not wait
            src = src.map_batches(throttle, name="throttle")
        windowed = src.key_by("user").window(
            assigner, timestamp="ts", allowed_lateness_ms=300,
            pre_aggregate=pre_aggregate).agg(n=("count", None), total=("sum", "x"))
        return env, windowed.collect()

    got = user_window_rows(rescaled_run(job, tmp_path, f"windows-{backend}-{windows}"))
    assert not got.duplicated(["user", "window_start"]).any()  # no window emitted twice
    slide = getattr(assigner, "slide_ms", None)
    pd.testing.assert_frame_equal(got, user_window_sums(user_events, n, 1000, slide),
                                  check_dtype=False)


class Inactivity(rs.KeyedProcessFunction):
    """Emits a key's count when it has been idle for 100 ms of event time."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)
        self.deadline = ctx.value_state("deadline")

    def process_element(self, row, ctx):
        self.count.update(self.count.value() + 1)
        if self.deadline.value() is not None:
            ctx.delete_event_time_timer(self.deadline.value())
        self.deadline.update(row["ts"] + 100)
        ctx.register_event_time_timer(row["ts"] + 100)

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain == "event_time"
        yield {"user": ctx.current_key, "fired": timestamp, "count": self.count.value()}
        self.count.clear()
        self.deadline.clear()


def phases(i: np.ndarray) -> dict:
    """One event per 10 ms; user ``i % 3`` sits out every third phase of 90 events (its
    events go to filler key 99 then), while the others move the watermark on."""
    user = i % 3
    idle = ((i // 90) + user) % 3 == 0
    return {"user": np.where(idle, 99, user), "ts": BASE + i * 10}


@pytest.mark.slow
def test_keyed_process_function_timers_equal_oracle(ray_session):
    n = 540
    env = rs.StreamEnvironment(parallelism=2)
    # one split, one row per batch: the watermark follows every row in order
    src = env.from_sequence(n, phases, batch_size=1, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0))
    sink = src.key_by("user").process(Inactivity()).collect()
    table = env.execute("timers").table(sink)
    e = phases(np.arange(n))
    expected = []
    for user in np.unique(e["user"]).tolist():
        times = e["ts"][e["user"] == user]
        # a key's timer (last + 100) fires before its next row iff some row of another
        # key moves the watermark past it first: a gap over 110 ms at 10 ms per row
        cut = np.flatnonzero(np.diff(times) > 110) + 1
        for part in np.split(times, cut):
            expected.append((user, int(part[-1]) + 100, len(part)))
    assert len(expected) >= 8  # several sessions per key
    got = sorted((r["user"], r["fired"], r["count"]) for r in table.to_pylist())
    assert got == sorted(expected)
