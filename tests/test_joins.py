"""Two-input keyed processing and the interval join, against pandas.

Operator-level tests drive an operator by hand with a fixed sequence of batches
and watermarks, so which rows are late is exact; job-level tests run on Ray at
parallelism 2 through a placed failure, and through stop-with-savepoints at
parallelism 1, 2 and 3 on either state backend (heap and disk), and compare the
committed output with ``pd.merge`` plus the interval filter over the same input.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.operators.interval_join import (IntervalBounds, IntervalJoinOperator,
                                                      IntervalJoinSpec, JoinSide)
from tests.support.functions import Ids
from tests.support.inputs import BASE
from tests.support.jobs import late_dropped, savepoint_chain
from tests.support.operators import feed_sides, pairs_of
from tests.support.oracles import expected_pairs, interval_oracle
from tests.support.pacing import Throttle
from tests.support.pipelines import join_job


# -- the operator by hand -----------------------------------------------------------------

def join_operator(bounds: IntervalBounds, index: int = 0, parallelism: int = 1,
                  fn=None, backend: StateBackend = StateBackend.HEAP) -> IntervalJoinOperator:
    spec = IntervalJoinSpec(bounds, (KeySelector.of("k"), KeySelector.of("k")), ("ts", "ts"))
    op = IntervalJoinOperator("join", spec, fn)
    op.setup(RuntimeContext("job", "join", index, parallelism, 128, 0, state_backend=backend),
             CollectingOutput())
    return op


def make_side(rng, n: int, first_id: int, keys: int, disorder: int) -> pd.DataFrame:
    ts = BASE + np.sort(rng.integers(0, 20 * n, n)) + rng.integers(0, disorder + 1, n)
    return pd.DataFrame({"id": np.arange(first_id, first_id + n), "k": rng.integers(0, keys, n),
                         "ts": ts, "side": rng.integers(0, 2, n)})


def drive(op, events: pd.DataFrame, *, lag: int = 40) -> pd.DataFrame:
    """:func:`feed_sides` the rows in batches of 17: the rows that were late on arrival
    (ts < watermark), as the operator must judge them."""
    fed = feed_sides(op, events, batch=17, lag=lag)
    return fed[fed["ts"] < fed["wm"]]


@pytest.mark.parametrize("bounds", [IntervalBounds(-30, 20), IntervalBounds(5, 60),
                                    IntervalBounds(-50, -10, lower_inclusive=False),
                                    IntervalBounds(0, 2), IntervalBounds(-25, 25, upper_inclusive=False)])
def test_interval_join_operator_equals_pandas_and_drops_late_rows(bounds):
    rng = np.random.default_rng(7)
    # disorder up to 120 ms against a watermark lag of 40: many rows are late
    events = make_side(rng, 1500, 0, keys=25, disorder=120)
    op = join_operator(bounds)
    op.initialize_state(None)
    op.open()
    late = drive(op, events)
    assert 20 < len(late) < len(events) // 2
    on_time = events[~events["id"].isin(late["id"])]
    expected = interval_oracle(on_time[on_time["side"] == 0], on_time[on_time["side"] == 1],
                               bounds.lower, bounds.upper)
    got = pairs_of(op.output.batches)
    assert len(got) == len(set(got))  # every pair once
    assert set(got) == expected and expected
    metrics = op.metrics()
    assert metrics["late_records_dropped"] == len(late)
    assert metrics["late_left_dropped"] == int((late["side"] == 0).sum())
    # the buffers hold only what an on-time row could still join
    wm = op.current_watermark
    left, right = (op.buffers[s].combined() for s in JoinSide)
    assert left is None or (left.ts + bounds.upper >= wm).all()
    assert right is None or (right.ts - bounds.lower >= wm).all()
    op.process_watermark(rs.MAX_WATERMARK)
    assert metrics and op.metrics()["buffered_left"] == op.metrics()["buffered_right"] == 0


def test_default_output_names_and_process_join_function():
    op = join_operator(IntervalBounds(0, 10))
    op.initialize_state(None)
    op.open()
    op.process_batch(pa.record_batch({"k": ["a", "a", "b"], "ts": [100, 105, 100],
                                      "x": [1, 2, 3]}), 0)
    op.process_batch(pa.record_batch({"k": ["a", "b"], "ts": [108, 120], "y": [9.0, 8.0]}), 1)
    table = pa.Table.from_batches(op.output.batches)
    assert table.column_names == ["k", "ts", "x", "k_right", "ts_right", "y"]
    assert sorted(table.to_pylist(), key=lambda r: r["x"]) == [
        {"k": "a", "ts": 100, "x": 1, "k_right": "a", "ts_right": 108, "y": 9.0},
        {"k": "a", "ts": 105, "x": 2, "k_right": "a", "ts_right": 108, "y": 9.0}]

    class Gap(rs.ProcessJoinFunction):
        def process_element(self, left, right, ctx):
            if ctx.right_timestamp - ctx.left_timestamp > 5:
                ctx.output("far", {"x": left["x"]})
            yield {"key": ctx.current_key, "x": left["x"], "at": ctx.timestamp}

    op = join_operator(IntervalBounds(-10, 10), fn=Gap())
    op.initialize_state(None)
    op.open()
    op.process_batch(pa.record_batch({"k": ["a", "b"], "ts": [108, 100], "y": [9.0, 8.0]}), 1)
    op.process_batch(pa.record_batch({"k": ["a", "a", "b"], "ts": [100, 105, 130],
                                      "x": [1, 2, 3]}), 0)
    rows = pa.Table.from_batches(op.output.batches).to_pylist()
    assert sorted(rows, key=lambda r: r["x"]) == [{"key": "a", "x": 1, "at": 108},
                                                  {"key": "a", "x": 2, "at": 108}]
    assert pa.Table.from_batches(op.output.side_batches["far"]).to_pylist() == [{"x": 1}]


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="empty"):
        IntervalBounds(5, 4)
    with pytest.raises(ValueError, match="empty"):
        IntervalBounds(0, 0, upper_inclusive=False)
    with pytest.raises(TypeError, match="lower_ms"):
        IntervalBounds(0.5, 4)


@pytest.mark.parametrize("backend", [StateBackend.HEAP, StateBackend.DISK],
                         ids=lambda b: b.value)
def test_buffers_restore_at_other_parallelism_by_key_group(backend):
    """Snapshot mid-stream, restore into 1, 2 and 3 subtasks by key group: the pairs
    after the snapshot are those of an uninterrupted run. On disk the rows travel in the
    backend's sections (a heap snapshot moving into disk: tests/test_disk_joins.py)."""
    bounds = IntervalBounds(-40, 40)
    rng = np.random.default_rng(3)
    events = make_side(rng, 1200, 0, keys=60, disorder=30)
    first, rest = events.iloc[:600], events.iloc[600:]
    whole = join_operator(bounds, backend=backend)
    whole.initialize_state(None)
    whole.open()
    drive(whole, first, lag=40)
    snapshot_watermark = whole.current_watermark
    snapshot = whole.snapshot_state(1).keyed_state  # the synchronous part
    assert snapshot is not None
    before = len(pairs_of(whole.output.batches))  # pyright: ignore[reportAttributeAccessIssue]
    drive(whole, rest, lag=40)  # changes the buffers before the asynchronous part runs
    sections = snapshot()
    expected = pairs_of(whole.output.batches)[before:]  # pyright: ignore[reportAttributeAccessIssue]
    assert expected
    floors = WatermarkFloors.from_json(snapshot_watermark, max_parallelism=128)
    for parallelism in (1, 2, 3):
        got = []
        for index in range(parallelism):
            groups = rs.key_group_range(index, parallelism, 128)
            op = join_operator(bounds, index, parallelism, backend=backend)
            op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                      if g in groups], floors))
            op.open()
            assert (op.disk_rows is not None) == (backend is StateBackend.DISK)
            mine = rest[[rs.key_group_of(k, 128) in groups for k in rest["k"].tolist()]]
            drive(op, mine, lag=40)
            got += pairs_of(op.output.batches)  # pyright: ignore[reportAttributeAccessIssue]
        # the restored operators see only their keys' rows, so their watermarks differ
        # from the whole run's; with disorder below the lag no row is late anywhere
        assert sorted(got) == sorted(expected), parallelism


# -- jobs on Ray ------------------------------------------------------------------------------

throttle = Throttle(0.02)  # keeps the job running across several checkpoints


crawl = Throttle(0.06)  # the runs of a savepoint chain must still be running when stopped


def test_interval_join_job_at_parallelism_2_equals_pandas_exactly_once(ray_session, tmp_path):
    n, lower, upper = 12_000, -30, 20
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path)),
        failpoints=[rs.Failpoint("in_processing", operator="join", subtask=1, hit=60,
                                 action="exit")],
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink = join_job(env, n, lower, upper, pace=throttle)
    result = env.execute("interval-join")
    assert result.restarts == 1, result.failures
    got = pairs_of(result.table(sink))
    assert len(got) == len(set(got))  # no pair twice, though one subtask died midway
    expected = expected_pairs(n, lower, upper)
    assert set(got) == expected and len(expected) > 1000
    stragglers = int(np.count_nonzero((np.arange(n) % 400 == 399) & (np.arange(n) > 2000)))
    # the last attempt replays from the checkpoint: it counts at most every straggler
    assert 0 < late_dropped(result.metrics) <= stragglers


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_interval_join_through_savepoints_at_1_2_3_exactly_once(ray_session, tmp_path, backend):
    """Stopped with a savepoint at parallelism 1 with rows buffered (on disk: in RocksDB),
    restored at 2, stopped again, restored at 3: the pairs over the three runs (through a
    ProcessJoinFunction) are those of pandas, each once."""
    n, lower, upper = 12_000, -10, 60

    def job(parallelism: int):
        env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.2, storage=str(tmp_path / f"chk{parallelism}"), retained=2,
            state_backend=backend))
        return env, join_job(env, n, lower, upper, fn=Ids(),
                            pace=crawl if parallelism < 3 else None)

    runs = savepoint_chain(tmp_path, f"join-{backend}", job)
    tables = [result.table(sink) for result, sink in runs]
    assert all(t.num_rows for t in tables), [t.num_rows for t in tables]  # each run midway
    got = pairs_of(pa.concat_tables(tables))
    assert len(got) == len(set(got))
    assert set(got) == expected_pairs(n, lower, upper)


# -- two-input keyed process function ------------------------------------------------------

END = 4_000  # ms after BASE: each key reports once the watermark of *both* inputs passes it


class Totals(rs.KeyedCoProcessFunction):
    """Counts the first input's rows before END and sums the second's values, per key,
    in state both inputs share; reports at END - 1 (event time). Values divisible by 10
    go to side output "tens"."""

    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)
        self.total = ctx.value_state("total", default=0)

    def process_element1(self, row, ctx):
        if row["ts"] < BASE + END:
            self.count.update(self.count.value() + 1)
            ctx.register_event_time_timer(BASE + END - 1)

    def process_element2(self, row, ctx):
        self.total.update(self.total.value() + row["v"])
        ctx.register_event_time_timer(BASE + END - 1)
        if row["v"] % 10 == 0:
            ctx.output("tens", {"k": ctx.current_key, "v": row["v"]})

    def on_timer(self, timestamp, ctx):
        assert ctx.time_domain == "event_time" and ctx.current_watermark >= timestamp
        yield {"k": ctx.current_key, "count": self.count.value(), "total": self.total.value(),
               "at": timestamp}


def test_keyed_co_process_function_shares_state_and_timers_exactly_once(ray_session, tmp_path):
    n1, n2 = 8_000, 3_000
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path)),
        failpoints=[rs.Failpoint("in_processing", operator="totals", subtask=0, hit=15,
                                 action="exit")],
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    wm = rs.BoundedOutOfOrderness("ts", bound_ms=50)
    # the first input runs far past END in event time, the second stays before it (and
    # slower): a watermark that was not the minimum of both would fire early
    first = env.from_sequence(n1, lambda i: {"user": i % 13, "ts": BASE + i}, batch_size=250,
                              num_splits=2, watermarks=wm, name="first")
    second = env.from_sequence(n2, lambda i: {"id": i % 13, "v": i,
                                              "ts": BASE + i * (END - 100) // n2},
                               batch_size=100, num_splits=2, watermarks=wm, name="second") \
        .map_batches(throttle, name="throttle")
    totals = first.key_by("user").connect(second.key_by("id")).process(Totals(), name="totals")
    main, tens = totals.collect(name="main"), totals.side_output("tens").collect(name="tens")
    result = env.execute("co-process")
    assert result.restarts == 1, result.failures

    i1, i2 = np.arange(n1), np.arange(n2)
    count = pd.Series(i1 % 13)[BASE + i1 < BASE + END].value_counts()
    total = pd.Series(i2).groupby(i2 % 13).sum()
    expected = sorted((k, int(count.get(k, 0)), int(total[k]), BASE + END - 1) for k in range(13))
    got = sorted((r["k"], r["count"], r["total"], r["at"]) for r in result.table(main).to_pylist())
    assert got == expected  # each key once, with both inputs complete
    got_tens = sorted(result.table(tens)["v"].to_pylist())
    assert got_tens == [v for v in i2.tolist() if v % 10 == 0]


def test_connect_process_needs_a_co_process_function_on_keyed_streams(ray_session):
    env = rs.StreamEnvironment()
    a, b = env.from_collection([{"k": 1}]), env.from_collection([{"k": 1}])
    with pytest.raises(TypeError, match="KeyedCoProcessFunction"):
        a.key_by("k").connect(b.key_by("k")).process(rs.KeyedProcessFunction())
    with pytest.raises(TypeError, match="two keyed streams"):
        a.connect(b).process(rs.KeyedCoProcessFunction())
    with pytest.raises(ValueError, match="event-time column"):
        a.key_by("k").interval_join(b.key_by("k"))


def test_co_process_operator_shares_state_and_timers_across_inputs_and_restores():
    """By hand: both inputs update one key's state, a timer registered by either fires
    once for the key, and the state moves with its key group to another parallelism.
    The operator's output has no side outputs: ``ctx.output`` to an unread tag is a no-op."""
    from raystream.actors.operator import BroadcastingOutput
    from raystream.engine.operators.co_process import KeyedCoProcessOperator

    def operator(index=0, parallelism=1):
        op = KeyedCoProcessOperator("co", Totals(), (KeySelector.of("user"), KeySelector.of("id")))
        out = CollectingOutput()
        op.setup(RuntimeContext("job", "co", index, parallelism, 128, 0), BroadcastingOutput([out]))
        return op, out

    users = np.arange(40) % 8
    first = pa.record_batch({"user": users, "ts": BASE + np.arange(40)})
    second = pa.record_batch({"id": users, "v": np.arange(40), "ts": BASE + np.arange(40)})
    op, _ = operator()
    op.initialize_state(None)
    op.open()
    op.process_batch(first, 0)
    snapshot = op.snapshot_state(1).keyed_state
    op.process_batch(second, 1)  # after the synchronous snapshot: not in it
    sections = snapshot()
    expected = {(k, 5, int(np.arange(40)[users == k].sum())) for k in range(8)}
    op.process_watermark(BASE + END)
    rows = pa.Table.from_batches(_out_batches(op)).to_pylist()
    assert {(r["k"], r["count"], r["total"]) for r in rows} == expected and len(rows) == 8
    got = []
    for index in range(3):  # restored at parallelism 3, the second input replayed
        groups = rs.key_group_range(index, 3, 128)
        op, _ = operator(index, 3)
        op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                  if g in groups]))
        op.open()
        mine = np.array([rs.key_group_of(k, 128) in groups for k in users.tolist()])
        op.process_batch(second.filter(pa.array(mine)), 1)
        op.process_watermark(rs.MAX_WATERMARK)
        got += pa.Table.from_batches(_out_batches(op)).to_pylist() if _out_batches(op) else []
    assert {(r["k"], r["count"], r["total"]) for r in got} == expected and len(got) == 8


def _out_batches(op) -> list:
    return op.output.targets[0].batches


def test_buffer_matching_equals_brute_force_on_both_index_paths():
    """The (key, ts)-sorted range search and the wide-buffer fallback (key runs, then a
    time filter) give exactly the pairs a double loop finds, and so does a buffer of
    many segments (appended in pieces, some merged, some cut by a time limit)."""
    from raystream.engine.operators.interval_index import SortedRows, _match_by_key_runs
    from raystream.engine.operators.interval_join import _Buffer, _Rows

    rng = np.random.default_rng(1)
    for trial in range(200):
        m, n = int(rng.integers(1, 60)), int(rng.integers(1, 30))
        kid_b, ts_b = rng.integers(0, 6, m), rng.integers(0, 100, m)
        kid_p, ts_p = rng.integers(0, 7, n), rng.integers(-20, 120, n)
        lo = int(rng.integers(-30, 10))
        hi = lo + int(rng.integers(0, 30))
        limit = int(rng.integers(-10, 60))  # rows below it are dropped from the buffer
        brute = {(i, j) for i in range(n) for j in range(m)
                 if kid_p[i] == kid_b[j] and ts_p[i] + lo <= ts_b[j] <= ts_p[i] + hi}
        rows = _Rows(pa.table({"x": np.arange(m)}), ts_b, kid_b)
        probe, buffered = SortedRows.of(rows).matches(kid_p, ts_p, (lo, hi))
        assert sorted(zip(probe.tolist(), buffered.tolist())) == sorted(brute), trial
        probe, buffered = _match_by_key_runs(SortedRows.of(rows), kid_p, ts_p, (lo, hi))
        assert sorted(zip(probe.tolist(), buffered.tolist())) == sorted(brute), trial
        buffer = _Buffer(segment_rows=int(rng.integers(1, 20)))
        cuts = np.unique(rng.integers(0, m + 1, 6))
        for part in np.split(np.arange(m), cuts):
            if len(part):
                buffer.append(rows.take(part))
        assert len(buffer) == m
        buffer.drop_before(limit)
        probe, matched = buffer.matches(kid_p, ts_p, (lo, hi))
        got = [] if matched is None else list(zip(probe.tolist(), matched.table["x"].to_pylist()))
        assert sorted(got) == sorted((i, j) for i, j in brute if ts_b[j] >= limit), trial
        assert buffer.min_ts == (int(ts_b[ts_b >= limit].min()) if (ts_b >= limit).any() else None)
