"""Window join and co-group, against pandas (a merge per window).

Operator-level tests drive the operator by hand with a fixed sequence of batches
and watermarks, so which rows are late is exact; job-level tests run on Ray at
parallelism 2 (3 after a rescale), through a placed failure and through a
stop-with-savepoint, and compare the committed output with the oracle over the
same input. The oracle (tests/support/oracles.py) computes windows its own way: pandas
arithmetic per assigner, sessions with ``groupby``/``diff``/``cumsum`` over both sides'
rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.engine.windows.join import WindowJoinKind, WindowJoinOperator, WindowJoinSpec
from tests.support.inputs import STRAGGLER_START, join_events, join_input
from tests.support.jobs import late_dropped, rescaled_run
from tests.support.operators import (JOIN_SESSION, JOIN_SLIDING, JOIN_TUMBLING, drive_join,
                                     output_of, window_pairs_of)
from tests.support.oracles import expected_window_pairs, oracle_groups, oracle_pairs
from tests.support.pacing import Throttle
from tests.support.pipelines import sides

crawl = Throttle(0.06)


# -- the operator by hand ---------------------------------------------------------------------

def window_operator(assigner, kind=WindowJoinKind.JOIN, fn=None, index=0, parallelism=1,
                    right_key="k"):
    spec = WindowJoinSpec(kind, assigner, (KeySelector.of("k"), KeySelector.of(right_key)),
                          ("ts", "ts"))
    op = WindowJoinOperator("wjoin", spec, fn)
    op.setup(RuntimeContext("job", "wjoin", index, parallelism, 128, 0), CollectingOutput())
    return op


@pytest.mark.parametrize("assigner", [JOIN_TUMBLING, JOIN_SLIDING, JOIN_SESSION],
                         ids=["tumbling", "sliding", "session"])
def test_join_operator_equals_pandas_per_window_and_drops_late_rows(assigner, caplog):
    rng = np.random.default_rng(11)
    # non-merging windows: disorder 250 ms against a lag of 40: rows are late for some or all
    # of their windows; sessions (where a row at the watermark could touch a fired session):
    # disorder within the lag. Both: stragglers a second late
    merging = isinstance(assigner, rs.EventTimeSessionWindows)
    frame = join_input(rng, 1500, keys=4, disorder=30 if merging else 250)
    stragglers = frame.index[(frame.index % 97 == 96) & (frame.index > 300)]
    frame.loc[stragglers, "ts"] -= 1000
    op = window_operator(assigner)
    op.initialize_state(None)
    op.open()
    on_time, late = drive_join(op, frame, assigner)
    assert 10 < len(late) < len(frame) // 3
    expected = oracle_pairs(on_time[on_time["side"] == 0], on_time[on_time["side"] == 1],
                            assigner)
    table = output_of(op)
    got = window_pairs_of(table)
    assert len(got) == len(set(got))  # each pair once per window
    assert set(got) == expected and len(expected) > 500  # many-to-many: 4 keys
    assert table.column_names == ["id", "k", "ts", "id_right", "k_right", "ts_right",
                                  "window_start", "window_end"]
    metrics = op.metrics()
    assert metrics["late_records_dropped"] == len(late)
    assert metrics["late_right_dropped"] == int((late["side"] == 1).sum())
    assert metrics["buffered_left"] == metrics["buffered_right"] == 0
    # one warning for all the drops (then at most one a minute)
    warnings = [r for r in caplog.records if r.name == "raystream.engine.windows.join"]
    assert len(warnings) == 1 and "dropped" in warnings[0].getMessage()


def test_column_collisions_and_apply_per_pair():
    """Clashing names get the documented suffixes; ``apply`` sees dict rows, None drops a
    pair, and rows without window columns get their window's."""
    op = window_operator(JOIN_TUMBLING)
    op.initialize_state(None)
    op.open()
    op.process_batch(pa.record_batch({"k": ["a", "a", "b"], "ts": [1, 5, 7], "x": [1, 2, 3],
                                      "window_end": [9, 9, 9]}), 0)
    op.process_batch(pa.record_batch({"k": ["a", "b", "c"], "ts": [50, 60, 70],
                                      "x": [7.0, 8.0, 9.0], "window_start": [0, 0, 0]}), 1)
    op.process_watermark(99)
    assert output_of(op).to_pylist() == [
        {"k": "a", "ts": 1, "x": 1, "window_end_left": 9, "k_right": "a", "ts_right": 50,
         "x_right": 7.0, "window_start_right": 0, "window_start": 0, "window_end": 100},
        {"k": "a", "ts": 5, "x": 2, "window_end_left": 9, "k_right": "a", "ts_right": 50,
         "x_right": 7.0, "window_start_right": 0, "window_start": 0, "window_end": 100},
        {"k": "b", "ts": 7, "x": 3, "window_end_left": 9, "k_right": "b", "ts_right": 60,
         "x_right": 8.0, "window_start_right": 0, "window_start": 0, "window_end": 100}]

    def keep_odd(left, right):
        return {"x": left["x"], "y": right["y"]} if left["x"] % 2 else None

    op = window_operator(JOIN_SLIDING, fn=keep_odd)
    op.initialize_state(None)
    op.open()
    op.process_batch(pa.record_batch({"k": [1, 1, 1], "ts": [60, 70, 110], "x": [1, 2, 3]}), 0)
    op.process_batch(pa.record_batch({"k": [1], "ts": [105], "y": [0.5]}), 1)
    op.process_watermark(rs.MAX_WATERMARK)
    rows = sorted(output_of(op).to_pylist(), key=lambda r: (r["window_start"], r["x"]))
    assert rows == [{"x": 1, "y": 0.5, "window_start": 0, "window_end": 120},
                    {"x": 3, "y": 0.5, "window_start": 0, "window_end": 120},
                    {"x": 1, "y": 0.5, "window_start": 50, "window_end": 170},
                    {"x": 3, "y": 0.5, "window_start": 50, "window_end": 170},
                    {"x": 3, "y": 0.5, "window_start": 100, "window_end": 220}]


@pytest.mark.parametrize("assigner", [JOIN_TUMBLING, JOIN_SESSION], ids=["tumbling", "session"])
def test_co_group_sees_keys_of_one_side_and_join_does_not(assigner):
    """Left keys 0..5, right keys 3..8 (column ``user``): co_group gets every key and
    window with rows on either side (the other side an empty table with its columns)."""
    rng = np.random.default_rng(5)
    frame = join_input(rng, 900, keys=6, disorder=20)
    frame.loc[frame["side"] == 1, "k"] += 3
    frame["user"] = frame["k"]
    seen_columns = set()

    def groups(key, left, right, window):
        seen_columns.add((tuple(left.column_names), tuple(right.column_names)))
        yield {"k": key, "start": window.start, "end": window.end,
               "left": tuple(sorted(left["id"].to_pylist())),
               "right": tuple(sorted(right["id"].to_pylist()))}

    op = window_operator(assigner, WindowJoinKind.CO_GROUP, groups, right_key="user")
    op.initialize_state(None)
    op.open()
    _, late = drive_join(op, frame, assigner, columns=("id", "k", "ts"),
                         right_columns=("id", "user", "ts"))
    assert late.empty
    left, right = frame[frame["side"] == 0], frame[frame["side"] == 1]
    expected = oracle_groups(left, right, assigner)
    table = output_of(op)
    got = [(r["k"], r["start"], r["end"], tuple(r["left"]), tuple(r["right"]))
           for r in table.to_pylist()]
    assert len(got) == len(set(got)) and set(got) == expected
    assert any(not g[3] for g in got) and any(not g[4] for g in got)  # one-sided groups
    assert seen_columns == {(("id", "k", "ts"), ("id", "user", "ts"))}
    assert table["window_end"].to_pylist() == table["end"].to_pylist()

    join = window_operator(assigner, right_key="user")  # the join: keys 3..5 only
    join.initialize_state(None)
    join.open()
    drive_join(join, frame, assigner, columns=("id", "k", "ts"),
               right_columns=("id", "user", "ts"))
    joined = output_of(join)
    assert set(joined["k"].to_pylist()) == {3, 4, 5}
    assert set(window_pairs_of(joined)) == oracle_pairs(left, right.assign(k=right["user"]),
                                                        assigner)


def test_buffers_restore_at_other_parallelism_by_key_group():
    """Snapshot mid-stream, restore into 1, 2 and 3 subtasks by key group: the output
    after the snapshot is that of an uninterrupted run."""
    rng = np.random.default_rng(3)
    frame = join_input(rng, 1200, keys=40, disorder=30)
    first, rest = frame.iloc[:600], frame.iloc[600:]
    whole = window_operator(JOIN_SESSION)
    whole.initialize_state(None)
    whole.open()
    for start in range(0, 600, 50):  # by hand, without the final watermark
        chunk = first.iloc[start:start + 50]
        for side in (0, 1):
            part = chunk[chunk["side"] == side][["id", "k", "ts"]]
            whole.process_batch(pa.RecordBatch.from_pandas(part, preserve_index=False), side)
        whole.process_watermark(int(chunk["ts"].max()) - 41)
    snapshot_watermark = whole.current_watermark
    snapshot = whole.snapshot_state(1).keyed_state  # the synchronous part
    before = output_of(whole).num_rows
    # changes the buffers before the asynchronous part runs
    drive_join(whole, rest, JOIN_SESSION)
    sections = snapshot()
    expected = window_pairs_of(output_of(whole))[before:]
    assert expected
    floors = WatermarkFloors.from_json(snapshot_watermark, max_parallelism=128)
    for parallelism in (1, 2, 3):
        got = []
        for index in range(parallelism):
            groups = rs.key_group_range(index, parallelism, 128)
            op = window_operator(JOIN_SESSION, index=index, parallelism=parallelism)
            op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                      if g in groups], floors))
            op.open()
            mine = rest[[rs.key_group_of(k, 128) in groups for k in rest["k"].tolist()]]
            drive_join(op, mine, JOIN_SESSION)
            got += window_pairs_of(output_of(op)) if op.output.batches else []
        assert sorted(got) == sorted(expected), parallelism


def test_builder_checks_its_arguments():
    env = rs.StreamEnvironment()
    a, b = env.from_collection([{"k": 1, "ts": 1}]), env.from_collection([{"k": 1, "ts": 1}])
    with pytest.raises(ValueError, match="event-time column"):
        a.join(b).where("k").equal_to("k").window(JOIN_TUMBLING)
    with pytest.raises(ValueError, match="only event-time windows"):
        a.join(b).where("k").equal_to("k").window(
            rs.TumblingProcessingTimeWindows(size_ms=10), timestamp="ts").join()
    with pytest.raises(TypeError, match="finish a co-group with apply"):
        a.co_group(b).where("k").equal_to("k").window(JOIN_TUMBLING, timestamp="ts").join()
    with pytest.raises(ValueError, match="different non-empty"):
        a.join(b).where("k").equal_to("k").window(JOIN_TUMBLING, timestamp="ts").join(
            right_suffix="_left")


# -- jobs on Ray ------------------------------------------------------------------------------

def stragglers(n: int) -> int:
    i = np.arange(n)
    return int(np.count_nonzero((i % 400 == 399) & (i > STRAGGLER_START)))


@pytest.mark.slow
def test_window_join_and_co_group_job_through_a_failure_exactly_once(ray_session, tmp_path):
    n = 10_000
    assigner = rs.TumblingEventTimeWindows(size_ms=300)
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.2, storage=str(tmp_path)),
        failpoints=[rs.Failpoint("in_processing", operator="join", subtask=1, hit=40,
                                 action="exit")],
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    left, right = sides(env, n)
    joined = left.join(right).where("k").equal_to("k").window(assigner, timestamp="ts") \
        .join(name="join")
    counts = left.co_group(right).where("k").equal_to("k").window(assigner, timestamp="ts") \
        .apply(lambda key, lrows, rrows, window: [{"k": key, "left": lrows.num_rows,
                                                   "right": rrows.num_rows}], name="co_group")
    # the join's results chain into a window with no timestamp= (event time window_end - 1)
    per_window = joined.key_by("k").window(assigner).count()
    sinks = joined.collect(name="pairs"), counts.collect(name="counts"), per_window.collect()
    result = env.execute("window-join")
    assert result.restarts == 1, result.failures
    got = window_pairs_of(result.table(sinks[0]))
    assert len(got) == len(set(got))  # no pair twice, though one subtask died midway
    expected = expected_window_pairs(n, assigner)
    assert set(got) == expected and len(expected) > 5000
    assert 0 < late_dropped({k: v for k, v in result.metrics.items() if "join" in k}) \
        <= stragglers(n)

    frame = pd.DataFrame(join_events(np.arange(n)))
    i = frame["id"].to_numpy()
    on_time = frame[~((i % 400 == 399) & (i > STRAGGLER_START))]
    groups = oracle_groups(on_time[on_time["side"] == 0], on_time[on_time["side"] == 1],
                           assigner)
    want = sorted((k, s, e, len(lids), len(rids)) for k, s, e, lids, rids in groups)
    got_counts = sorted((r["k"], r["window_start"], r["window_end"], r["left"], r["right"])
                        for r in result.table(sinks[1]).to_pylist())
    assert got_counts == want
    pairs = pd.DataFrame(list(expected), columns=["id", "id_right", "start", "end"])
    pairs["k"] = pd.DataFrame(join_events(pairs["id"].to_numpy()))["k"]
    want_counts = sorted((int(k), int(s), int(c)) for (k, s), c in
                         pairs.groupby(["k", "start"]).size().items())
    assert sorted((r["k"], r["window_start"], r["count"])
                  for r in result.table(sinks[2]).to_pylist()) == want_counts


@pytest.mark.slow
def test_window_join_survives_a_savepoint_and_a_rescale_exactly_once(ray_session, tmp_path):
    """Stopped with a savepoint at parallelism 2 with rows buffered, restored at 3: the
    pairs over both runs (session windows, through ``apply``) are pandas', each once."""
    n = 12_000
    assigner = JOIN_SESSION

    def odd(left, right):
        return {"id": left["id"], "id_right": right["id"]} if (left["id"] + right["id"]) % 2 \
            else None

    def job(parallelism: int):
        env = rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
            interval_s=0.2, storage=str(tmp_path / f"chk{parallelism}")))
        left, right = sides(env, n, pace=crawl if parallelism == 2 else None)
        joined = left.join(right).where("k").equal_to("k") \
            .window(assigner, timestamp="ts").apply(odd, name="join")
        return env, joined.collect()

    got = window_pairs_of(rescaled_run(job, tmp_path, "wjoin"))
    assert len(got) == len(set(got))
    assert set(got) == expected_window_pairs(n, assigner, odd)
