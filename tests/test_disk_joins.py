"""The interval join on the disk state backend: buffered rows in RocksDB, against pandas.

Operator-level tests drive a heap and a disk :class:`IntervalJoinOperator` with the
same batches and watermarks (disorder, rows beyond the bound, hot keys, a lagging
side) and check both against ``pd.merge`` plus the interval filter; snapshot tests
move a heap snapshot's buffers into disk subtasks and a disk one's into heap subtasks (disk sections
restored at other parallelisms, and the savepoint chain at parallelism 1, 2 and 3 on
either backend, are in tests/test_joins.py); job tests run real Ray jobs on the disk
backend through a subtask kill with full and incremental checkpoints.
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
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.operators.disk_join import KIND, STATE_NAMES
from raystream.engine.operators.interval_join import (IntervalBounds, IntervalJoinOperator,
                                                      IntervalJoinSpec, JoinSide)
from raystream.engine.windows.join import WindowJoinKind
from tests.support.functions import co_groups
from tests.support.inputs import BASE, join_input
from tests.support.jobs import disk_env, run_through_a_kill
from tests.support.operators import (JOIN_SESSION, JOIN_SLIDING, JOIN_TUMBLING, MAXP,
                                     drive_join, output_of, pairs_of, window_join_operator,
                                     window_pairs_of, window_rows)
from tests.support.oracles import (expected_pairs, expected_window_pairs, interval_oracle,
                                   oracle_groups, oracle_pairs)
from tests.support.pacing import Throttle
from tests.support.pipelines import join_job, sides

throttle = Throttle(0.02)

BOUNDS = [IntervalBounds(-30, 20), IntervalBounds(5, 60),
          IntervalBounds(-50, -10, lower_inclusive=False), IntervalBounds(0, 2),
          IntervalBounds(-1500, 2500, upper_inclusive=False)]


def join_operator(backend: StateBackend, bounds: IntervalBounds, *, index: int = 0,
                  parallelism: int = 1, fn=None) -> IntervalJoinOperator:
    spec = IntervalJoinSpec(bounds, (KeySelector.of("k"), KeySelector.of("k")), ("ts", "ts"))
    op = IntervalJoinOperator("join", spec, fn)
    op.setup(RuntimeContext("job", "join", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def make_events(seed: int, n: int, *, keys: int, disorder: int, hot: float = 0.0,
                lag_ms: int = 0) -> pd.DataFrame:
    """Rows of both sides (``side`` 0 left), about 4 ms apart, disordered by up to
    ``disorder`` ms; a share ``hot`` of them of key 0; right rows ``lag_ms`` behind."""
    rng = np.random.default_rng(seed)
    side = rng.integers(0, 2, n)
    ts = BASE + np.sort(rng.integers(0, 4 * n, n)) + rng.integers(0, disorder + 1, n)
    k = np.where(rng.random(n) < hot, 0, rng.integers(0, keys, n))
    return pd.DataFrame({"id": np.arange(n), "k": k, "ts": ts - np.where(side == 1, lag_ms, 0),
                         "side": side, "x": rng.random(n)})


def drive(op: IntervalJoinOperator, events: pd.DataFrame, *, batch: int = 8, lag: int = 40,
          ahead: int = 0) -> pd.DataFrame:
    """Feed each side's rows in batches, the left side ``ahead`` batches ahead of the
    right; after each batch the watermark is min over sides of max(ts seen) - lag - 1.
    Returns the rows that were late on arrival (ts < watermark)."""
    sides = [events[events["side"] == s] for s in (0, 1)]
    chunks = [[part.iloc[i:i + batch] for i in range(0, len(part), batch)] for part in sides]
    order = [(0, i) for i in range(min(ahead, len(chunks[0])))]
    for i in range(max(len(chunks[0]), len(chunks[1]))):
        order += [(0, i + ahead)] if i + ahead < len(chunks[0]) else []
        order += [(1, i)] if i < len(chunks[1]) else []
    late, watermark, seen = [], rs.MIN_WATERMARK, [rs.MIN_WATERMARK, rs.MIN_WATERMARK]
    for side, i in order:
        part = chunks[side][i]
        late.append(part[part["ts"] < watermark])
        op.process_batch(pa.RecordBatch.from_pandas(part[["id", "k", "ts", "x"]],
                                                    preserve_index=False), side)
        seen[side] = max(seen[side], int(part["ts"].max()))
        watermark = max(watermark, min(seen) - lag - 1)
        op.process_watermark(watermark)
    return pd.concat(late)


def stored_entries(op: IntervalJoinOperator) -> int:
    assert op.disk_rows is not None and not any(len(b) for b in op.buffers)
    return op.disk_rows.stored_entries()


def run_both(events: pd.DataFrame, bounds: IntervalBounds, **how) -> tuple[list, list, pd.DataFrame]:
    """(heap pairs, disk pairs, late rows) of one input; both backends see the same late rows."""
    outputs, lates = [], []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = join_operator(backend, bounds)
        op.initialize_state(None)
        op.open()
        late = drive(op, events, **how)
        metrics = op.metrics()
        assert metrics["late_records_dropped"] == len(late)
        assert metrics["late_left_dropped"] == int((late["side"] == 0).sum())
        op.process_watermark(rs.MAX_WATERMARK)
        if backend is StateBackend.DISK:
            assert stored_entries(op) == 0  # the last watermark deleted everything
        got = pairs_of(op.output.batches)  # pyright: ignore[reportAttributeAccessIssue]
        assert len(got) == len(set(got))
        outputs.append(sorted(got))
        lates.append(late)
    pd.testing.assert_frame_equal(lates[0], lates[1])
    return outputs[0], outputs[1], lates[1]


def on_time_oracle(events: pd.DataFrame, late: pd.DataFrame, bounds: IntervalBounds) -> list:
    on_time = events.loc[~events["id"].isin(late["id"])]
    left, right = (on_time.loc[on_time["side"] == side] for side in (0, 1))
    return sorted(interval_oracle(left, right, bounds.lower, bounds.upper))


@pytest.mark.parametrize("bounds", BOUNDS, ids=repr)
def test_disk_interval_join_equals_heap_and_pandas_with_late_rows(bounds):
    # disorder up to 120 ms against a watermark lag of 40: many rows are late
    events = make_events(1, 2000, keys=30, disorder=120)
    heap, disk, late = run_both(events, bounds)
    assert 20 < len(late) < len(events) // 2
    assert disk == heap == on_time_oracle(events, late, bounds) and disk


@pytest.mark.parametrize("bounds", [BOUNDS[0], BOUNDS[4]], ids=repr)
def test_hot_keys_and_a_lagging_side(bounds):
    """Half the rows of one key; the right side 3 s behind the left in event time and
    fed 30 batches later, so the left rows wait on disk (the watermark follows the
    lagging side)."""
    lagging = IntervalBounds(bounds.lower_ms - 3000, bounds.upper_ms - 3000,
                             bounds.lower_inclusive, bounds.upper_inclusive)
    events = make_events(2, 3000, keys=40, disorder=60, hot=0.5, lag_ms=3000)
    heap, disk, late = run_both(events, lagging, ahead=30)
    assert len(late)
    assert disk == heap == on_time_oracle(events, late, lagging) and len(disk) > 500


def test_many_keys_per_key_group():
    """Thousands of keys over 128 key groups, wide buckets: a probe asks a few keys of
    each (key group, bucket) among many stored, stepping over and seeking past the
    others."""
    bounds = IntervalBounds(-2000, 1500)
    events = make_events(8, 6000, keys=3000, disorder=50, hot=0.05)
    heap, disk, late = run_both(events, bounds, batch=30)
    assert disk == heap == on_time_oracle(events, late, bounds) and len(disk) > 300


@pytest.mark.parametrize("strings", [False, True], ids=["numbers", "strings"])
def test_string_keys_and_nulls_in_both_formats(strings):
    """Rows that are not all fixed-width numbers (string keys, a column with nulls) are
    stored as Arrow IPC messages, the others as numpy records; a probe reading both
    gets the heap's pairs."""
    events = make_events(4, 1500, keys=25, disorder=120)
    if strings:
        events["k"] = "user-" + events["k"].astype(str)
    events["x"] = events["x"].where(events["id"] % 7 != 0)  # some nulls
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = join_operator(backend, IntervalBounds(-30, 20))
        op.initialize_state(None)
        late = drive(op, events.assign(x=events["x"].where(events["id"] < 700)))
        op.process_watermark(rs.MAX_WATERMARK)
        table = pa.Table.from_batches(op.output.batches)  # pyright: ignore[reportAttributeAccessIssue]
        outputs.append(table.to_pandas().sort_values(["id", "id_right"]).reset_index(drop=True))
    pd.testing.assert_frame_equal(outputs[0], outputs[1])
    pairs = sorted(zip(outputs[1]["id"], outputs[1]["id_right"]))
    assert pairs == on_time_oracle(events, late, IntervalBounds(-30, 20)) and pairs
    assert outputs[1]["x"].isna().any() and outputs[1]["x"].notna().any()


def test_buffers_are_cleaned_at_the_watermark_by_bucket():
    """After each watermark the disk holds no bucket wholly below what an on-time row
    can still join, and nothing once the input ends."""
    bounds = IntervalBounds(-30, 20)
    events = make_events(3, 1500, keys=20, disorder=30)
    op = join_operator(StateBackend.DISK, bounds)
    op.initialize_state(None)
    drive(op, events)
    rows = op.disk_rows
    assert rows is not None and rows.bucket_ms == 1000
    wm = op.current_watermark
    for side in JoinSide:
        limit = bounds.first_joinable(side, wm) // rows.bucket_ms
        held = rows._low[side][rows._low[side] != np.iinfo(np.int64).max]
        assert len(held) and (held >= limit).all()
    assert 0 < stored_entries(op)
    op.process_watermark(rs.MAX_WATERMARK)
    assert stored_entries(op) == 0


def test_process_join_function_on_disk():
    class Gap(rs.ProcessJoinFunction):
        def process_element(self, left, right, ctx):
            if ctx.right_timestamp - ctx.left_timestamp > 5:
                ctx.output("far", {"x": left["x"]})
            yield {"key": ctx.current_key, "x": left["x"], "at": ctx.timestamp}

    op = join_operator(StateBackend.DISK, IntervalBounds(-10, 10), fn=Gap())
    op.initialize_state(None)
    op.open()
    op.process_batch(pa.record_batch({"k": ["a", "b"], "ts": [108, 100], "y": [9.0, 8.0]}), 1)
    op.process_batch(pa.record_batch({"k": ["a", "a", "b"], "ts": [100, 105, 130],
                                      "x": [1, 2, 3]}), 0)
    rows = pa.Table.from_batches(op.output.batches).to_pylist()  # pyright: ignore[reportAttributeAccessIssue]
    assert sorted(rows, key=lambda r: r["x"]) == [{"key": "a", "x": 1, "at": 108},
                                                  {"key": "a", "x": 2, "at": 108}]
    assert pa.Table.from_batches(op.output.side_batches["far"]).to_pylist() == [{"x": 1}]  # pyright: ignore[reportAttributeAccessIssue]


# -- snapshots ------------------------------------------------------------------------------

def snapshot_midway(backend: StateBackend, bounds, events: pd.DataFrame, half: int):
    """Drive the first ``half`` rows, snapshot (the synchronous part), drive the rest
    before the asynchronous part runs: (sections, watermark, pairs after the snapshot)."""
    whole = join_operator(backend, bounds)
    whole.initialize_state(None)
    whole.open()
    drive(whole, events.iloc[:half])
    watermark = whole.current_watermark
    snapshot = whole.snapshot_state(1).keyed_state
    assert snapshot is not None
    before = len(whole.output.batches)  # pyright: ignore[reportAttributeAccessIssue]
    drive(whole, events.iloc[half:])
    sections = snapshot()
    return sections, watermark, sorted(pairs_of(whole.output.batches[before:]))  # pyright: ignore[reportAttributeAccessIssue]


def restore_and_finish(backend: StateBackend, bounds, sections, watermark: int,
                       rest: pd.DataFrame, parallelism: int) -> list:
    floors = WatermarkFloors.from_json(watermark, max_parallelism=MAXP)
    got = []
    for index in range(parallelism):
        groups = rs.key_group_range(index, parallelism, MAXP)
        op = join_operator(backend, bounds, index=index, parallelism=parallelism)
        op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                  if g in groups], floors))
        op.open()
        if backend is StateBackend.DISK:
            assert op.disk_rows is not None
        mine = rest.loc[[rs.key_group_of(k, MAXP) in groups for k in rest["k"].tolist()]]
        drive(op, mine)
        got += pairs_of(op.output.batches)  # pyright: ignore[reportAttributeAccessIssue]
    return sorted(got)


def test_buffers_move_between_the_backends():
    """A heap snapshot's buffers move into a disk job's RocksDB, and a disk snapshot's
    rows into heap buffers (read back through a scratch database): restored into 2 and
    3 subtasks of the other backend, the pairs after the snapshot are the uninterrupted
    run's. (A disk snapshot restored into 1, 2 and 3 disk subtasks: tests/test_joins.py,
    parametrized over the backends.)"""
    bounds = IntervalBounds(-40, 40)
    events = make_events(5, 1600, keys=60, disorder=30)
    half = 800
    sections, watermark, expected = snapshot_midway(StateBackend.DISK, bounds, events, half)
    assert expected
    rest = events.iloc[half:]
    heap_sections, heap_watermark, heap_expected = snapshot_midway(StateBackend.HEAP, bounds,
                                                                   events, half)
    assert heap_expected == expected and heap_watermark == watermark
    assert restore_and_finish(StateBackend.DISK, bounds, heap_sections, watermark, rest,
                              2) == expected
    for parallelism in (1, 3):
        assert restore_and_finish(StateBackend.HEAP, bounds, sections, watermark, rest,
                                  parallelism) == expected, parallelism


def test_restored_rows_keep_their_bucket_width():
    """The bucket width comes with the state's kind: a restore with other bounds reads
    the rows with the width they were written with."""
    events = make_events(6, 600, keys=10, disorder=0)
    sections, watermark, _ = snapshot_midway(StateBackend.DISK, IntervalBounds(-3000, 3000),
                                             events, 300)
    op = join_operator(StateBackend.DISK, IntervalBounds(-30, 20))
    op.initialize_state(RestoredState(1, [], list(sections.items()), None))
    assert isinstance(op.backend, DiskKeyedStateBackend) and op.disk_rows is not None
    assert op.disk_rows.bucket_ms == 6001
    assert op.backend.state_kind(STATE_NAMES[0]) == f'{KIND} {{"bucket_ms": 6001}}'
    expected = restore_and_finish(StateBackend.HEAP, IntervalBounds(-30, 20), snapshot_midway(
        StateBackend.HEAP, IntervalBounds(-3000, 3000), events, 300)[0], watermark,
        events.iloc[300:], 1)
    assert restore_and_finish(StateBackend.DISK, IntervalBounds(-30, 20), sections, watermark,
                              events.iloc[300:], 1) == expected and expected


# -- the window join --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(WindowJoinKind), ids=lambda k: k.value)
@pytest.mark.parametrize("assigner", [JOIN_TUMBLING, JOIN_SLIDING, JOIN_SESSION],
                         ids=["tumbling", "sliding", "session"])
def test_disk_window_join_equals_heap_and_pandas(assigner, kind):
    """Rows late for some or all of their windows, and stragglers a second late: the
    disk job's pairs (co-groups) are the heap's and pandas' (sessions: by key on disk,
    tests/test_disk_generic_sessions.py)."""
    merging = isinstance(assigner, rs.EventTimeSessionWindows)
    frame = join_input(np.random.default_rng(11), 1500, keys=6,
                       disorder=30 if merging else 250)
    stragglers = frame.index[(frame.index % 97 == 96) & (frame.index > 300)]
    frame.loc[stragglers, "ts"] -= 1000
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = window_join_operator(backend, assigner, kind,
                                  co_groups if kind is WindowJoinKind.CO_GROUP else None)
        op.initialize_state(None)
        op.open()
        on_time, late = drive_join(op, frame, assigner)
        assert len(late) and op.metrics()["late_records_dropped"] == len(late)
        assert (op.disk_rows is not None) == (backend is StateBackend.DISK)
        if op.disk_rows is not None and not merging:
            assert not op.disk_rows.windows and op.disk_rows.stored_entries() == 0
        outputs.append(window_rows(op, kind))
    left, right = (on_time.loc[on_time["side"] == side] for side in (0, 1))
    if kind is WindowJoinKind.JOIN:
        expected = sorted(oracle_pairs(left, right, assigner))
    else:
        expected = sorted(oracle_groups(left, right, assigner))
    assert outputs[1] == outputs[0] == expected and expected


def test_disk_window_join_restores_at_other_parallelism():
    """A snapshot with windows open, restored into 1, 2 and 3 disk subtasks, from disk
    and from heap sections, and into 1 and 3 heap subtasks from disk sections: the
    windows fire as in the uninterrupted run."""
    frame = join_input(np.random.default_rng(3), 1200, keys=40, disorder=0)
    half = 600
    outputs = {}
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = window_join_operator(backend, JOIN_SLIDING)
        op.initialize_state(None)
        op.open()
        first = frame.iloc[:half]
        for side in (0, 1):
            part = first[first["side"] == side]
            op.process_batch(pa.RecordBatch.from_pandas(part[["id", "k", "ts"]],
                                                        preserve_index=False), side)
        watermark = int(first["ts"].max()) - 300
        op.process_watermark(watermark)
        snapshot = op.snapshot_state(1).keyed_state
        assert snapshot is not None
        outputs[backend] = (snapshot(), sorted(window_pairs_of(output_of(op))))
    assert outputs[StateBackend.HEAP][1] == outputs[StateBackend.DISK][1]
    before = outputs[StateBackend.DISK][1]
    rest = frame.iloc[half:]
    expected = sorted(oracle_pairs(frame.loc[frame["side"] == 0],
                                   frame.loc[frame["side"] == 1], JOIN_SLIDING))
    floors = WatermarkFloors.from_json(watermark, max_parallelism=MAXP)
    for source, target, parallelism in [
            (StateBackend.DISK, StateBackend.DISK, 1), (StateBackend.DISK, StateBackend.DISK, 2),
            (StateBackend.DISK, StateBackend.DISK, 3), (StateBackend.HEAP, StateBackend.DISK, 2),
            (StateBackend.DISK, StateBackend.HEAP, 1), (StateBackend.DISK, StateBackend.HEAP, 3)]:
        sections, got = outputs[source][0], list(before)
        for index in range(parallelism):
            groups = rs.key_group_range(index, parallelism, MAXP)
            op = window_join_operator(target, JOIN_SLIDING, index=index,
                                      parallelism=parallelism)
            op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                      if g in groups], floors))
            op.open()
            assert (op.disk_rows is not None) == (target is StateBackend.DISK)
            for side in (0, 1):
                mine = np.array([rs.key_group_of(k, MAXP) in groups for k in rest["k"].tolist()])
                part = rest.loc[(rest["side"] == side).to_numpy() & mine]
                if len(part):
                    op.process_batch(pa.RecordBatch.from_pandas(
                        part[["id", "k", "ts"]], preserve_index=False), side)
            op.process_watermark(rs.MAX_WATERMARK)
            got += window_pairs_of(output_of(op))
        assert sorted(got) == expected, (source, target, parallelism)


# -- jobs on Ray ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_interval_join_exactly_once_through_a_subtask_kill(ray_session, tmp_path,
                                                                incremental):
    n, lower, upper = 10_000, -30, 20
    env = disk_env(str(tmp_path / "chk"), 2, incremental=incremental)
    sink = join_job(env, n, lower, upper, pace=throttle)
    job = run_through_a_kill(env, "disk-join-kill", "join")
    got = pairs_of(job.table(sink))
    assert len(got) == len(set(got))  # no pair twice, though one subtask died midway
    expected = expected_pairs(n, lower, upper)
    assert set(got) == expected and len(expected) > 1000


def test_disk_window_join_exactly_once_through_a_subtask_kill(ray_session, tmp_path):
    """Tumbling windows on the disk backend with incremental checkpoints, one join
    subtask killed midway: every pair of pandas once."""
    n = 10_000
    assigner = rs.TumblingEventTimeWindows(size_ms=300)
    env = disk_env(str(tmp_path / "chk"), 2, incremental=True)
    left, right = sides(env, n)
    sink = left.join(right).where("k").equal_to("k").window(assigner, timestamp="ts") \
        .join(name="join").collect()
    job = run_through_a_kill(env, "disk-window-join-kill", "join")
    got = window_pairs_of(job.table(sink))
    assert len(got) == len(set(got))
    expected = expected_window_pairs(n, assigner)
    assert set(got) == expected and len(expected) > 5000
