"""Records later than the watermark bound, on every window path, with and without failures.

One reader (``num_splits=1``, source parallelism 1) emits batches of ``BATCH``
rows and a watermark after each, so the watermark every row meets at the window
operator is known exactly: the oracle computes, in numpy, which rows are late,
which update a window that already fired (allowed lateness), and so the exact
list of emissions per (key, window). Every path — pre-aggregated, dense without
pre-aggregation, dense with a late side output, a user ``AggregateFunction``
(generic) — must produce exactly that list, before and after a failover and
across a stop-with-savepoint restored at another parallelism.
"""

from __future__ import annotations


import numpy as np
import pyarrow as pa
import pytest
import ray

import raystream as rs
from tests.chaos.model import (CountAndSum, Events, emission_differences, emissions_of,
                               window_emissions)
from tests.support.jobs import wait_for_checkpoint
from tests.support.pacing import Throttle

EVENTS = Events()
N, BATCH, BOUND = EVENTS.n, EVENTS.batch, EVENTS.bound_ms
late_events = EVENTS.columns

ASSIGNERS = {"tumbling": rs.TumblingEventTimeWindows(size_ms=1000),
             "sliding": rs.SlidingEventTimeWindows(size_ms=1000, slide_ms=500)}


def oracle(assigner, lateness: int):
    return window_emissions(EVENTS, assigner, lateness)


PATHS = ("pre_aggregated", "dense", "late_output", "generic")


throttle = Throttle(0.03)  # keeps the job running long enough for checkpoints before a failure


def build(env: rs.StreamEnvironment, path: str, assigner, lateness: int, *, slow: bool = False):
    source = env.from_sequence(N, late_events, batch_size=BATCH, num_splits=1, parallelism=1,
                               watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=BOUND))
    if slow:
        source = source.map_batches(throttle, name="throttle", parallelism=1)
    windows = source.key_by("user").window(
        assigner, timestamp="ts", allowed_lateness_ms=lateness,
        late_output="late" if path == "late_output" else None,
        pre_aggregate=path == "pre_aggregated")
    if path == "generic":
        windowed = windows.aggregate(CountAndSum())
    else:
        windowed = windows.agg(n=("count", None), total=("sum", "x"))
    late = windowed.side_output("late").collect(name="late") if path == "late_output" else None
    return windowed.collect(), late


def rows_of(tables: list[pa.Table]) -> list[dict]:
    return [r for table in tables for r in table.to_pylist()]


def late_of(tables: list[pa.Table]) -> list[tuple]:
    return sorted((r["user"], r["ts"]) for r in rows_of(tables))


def assert_equal_emissions(got: list[dict], expected) -> None:
    differences = emission_differences(emissions_of(got), expected)
    assert not differences, "\n".join(differences)


@pytest.mark.slow
@pytest.mark.parametrize("assigner, lateness", [("tumbling", 0), ("sliding", 2500)])
@pytest.mark.parametrize("path", PATHS)
def test_every_path_handles_late_records_like_the_oracle(ray_session, path, assigner, lateness):
    expected, late_rows = oracle(ASSIGNERS[assigner], lateness)
    assert late_rows, "the input must have rows late for every window"
    if lateness:
        assert any(len(v) > 1 for v in expected.values()), "and rows within the lateness"
    env = rs.StreamEnvironment(parallelism=2)
    sink, late = build(env, path, ASSIGNERS[assigner], lateness)
    job = env.execute(f"late-{path}")
    assert_equal_emissions(rows_of([job.table(sink)]), expected)
    if late is not None:
        assert late_of([job.table(late)]) == late_rows


@pytest.mark.slow
@pytest.mark.parametrize("path", ["pre_aggregated", "late_output"])
def test_a_failover_does_not_reopen_fired_windows(ray_session, tmp_path, path):
    """A window subtask dies after a completed checkpoint: the restored window operator
    judges lateness by the checkpoint's watermark, so a late row does not re-create a
    window that fired and was purged before it."""
    assigner, lateness = ASSIGNERS["tumbling"], 0
    expected, late_rows = oracle(assigner, lateness)
    env = rs.StreamEnvironment(
        parallelism=2, checkpoints=rs.CheckpointConfig(interval_s=0.1, storage=str(tmp_path)),
        restart=rs.RestartStrategy.fixed_delay(3, 0.1))
    sink, late = build(env, path, assigner, lateness, slow=True)
    client = env.execute_async(f"late-failover-{path}")
    wait_for_checkpoint(client, after=2, timeout_s=120)
    ray.kill(client.subtask_actor("window", 0))
    job = client.wait(timeout_s=240)
    assert job.restarts == 1, job.failures
    assert_equal_emissions(rows_of([job.table(sink)]), expected)
    if late is not None:
        assert late_of([job.table(late)]) == late_rows


@pytest.mark.slow
@pytest.mark.parametrize("path", ["pre_aggregated", "late_output"])
def test_allowed_lateness_survives_a_stop_and_a_rescaled_restore(ray_session, tmp_path, path):
    """Sliding windows with allowed lateness, stopped with a savepoint at parallelism 2 and
    restored at 3: windows that fired keep their contents for the lateness, so late rows
    after the restore update them; the two runs' emissions are the oracle's."""
    assigner, lateness = ASSIGNERS["sliding"], 2500
    expected, late_rows = oracle(assigner, lateness)

    def job(parallelism: int):
        env = rs.StreamEnvironment(
            parallelism=parallelism,
            checkpoints=rs.CheckpointConfig(interval_s=0.1, storage=str(tmp_path / f"c{parallelism}")))
        return env, *build(env, path, assigner, lateness, slow=True)

    env, sink, late = job(2)
    client = env.execute_async(f"lateness-before-{path}")
    wait_for_checkpoint(client, after=2, timeout_s=120)
    first = client.stop_with_savepoint(str(tmp_path / "savepoint"))
    env, sink2, late2 = job(3)
    second = env.execute(f"lateness-after-{path}", restore_from=str(tmp_path / "savepoint"))
    before = first.table(sink)
    assert 0 < before.num_rows, "stopped midway"
    assert_equal_emissions(rows_of([before, second.table(sink2)]), expected)
    if late is not None:
        assert late_of([first.table(late), second.table(late2)]) == late_rows


def test_a_rescaled_restore_judges_each_key_group_by_its_former_owners_watermark():
    """Two subtasks at different watermarks (100 and 900) checkpoint; restored into one,
    a row late for the faster one's groups is dropped there, while the same timestamp is
    still on time for the slower one's groups. With one watermark for all (the lowest),
    the faster one's fired windows would open again."""
    from raystream.checkpoint.watermark_floors import WatermarkFloors
    from raystream.engine.keys import KeySelector
    from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
    from raystream.engine.windows.aggregates import AggregateSpec
    from raystream.engine.windows.functions import BuiltinAggregates
    from raystream.engine.windows.operator import WindowOperator

    def operator(index: int, parallelism: int) -> WindowOperator:
        op = WindowOperator("w", KeySelector.of("k"), rs.TumblingEventTimeWindows(size_ms=100),
                            function=BuiltinAggregates(AggregateSpec.of({"n": ("count", None)})),
                            timestamp="ts", late_output="late")
        op.setup(RuntimeContext("job", "w", index, parallelism, 128, 0), CollectingOutput())
        return op

    keys = np.arange(200)
    owner = np.array([rs.key_group_of(k, 128) * 2 // 128 for k in keys.tolist()])
    sections, runs = {}, []
    for index, watermark in ((0, 100), (1, 900)):
        op = operator(index, 2)
        op.initialize_state(None)
        mine = keys[owner == index]
        op.process_batch(pa.record_batch({"k": mine, "ts": np.full(len(mine), 50)}))
        op.process_watermark(watermark)  # window [0, 100) fired (and, lateness 0, purged)
        sections.update(op.snapshot_state(1).keyed_state())
        groups = rs.key_group_range(index, 2, 128)
        runs.append([[groups.start, groups.stop - 1, watermark]])
    floors = WatermarkFloors.combine(runs, max_parallelism=128)

    restored = operator(0, 1)
    restored.initialize_state(RestoredState(1, [], list(sections.items()), floors))
    assert restored.current_watermark == 100  # the lowest: no group goes back in time
    # ts 50 is late everywhere; ts 500 is late only where the watermark had reached 900
    restored.process_batch(pa.record_batch({"k": keys, "ts": np.full(len(keys), 50)}))
    restored.process_batch(pa.record_batch({"k": keys, "ts": np.full(len(keys), 500)}))
    restored.process_watermark(rs.MAX_WATERMARK)
    out = restored.output
    late = pa.Table.from_batches(out.side_batches["late"])
    fired = pa.Table.from_batches(out.batches) if out.batches else pa.table({"k": []})
    expected_late = [(k, 50) for k in keys.tolist()] + [
        (k, 500) for k in keys[owner == 1].tolist()]
    assert sorted(zip(late["k"].to_pylist(), late["ts"].to_pylist())) == sorted(expected_late)
    assert sorted(fired["k"].to_pylist()) == sorted(keys[owner == 0].tolist())
    assert set(fired["window_start"].to_pylist()) == {500}
