"""Count windows on the disk state backend: a key's count and pending rows in RocksDB.

Operator-level tests drive a heap and a disk :class:`CountWindowOperator` with the same
batches and check both against a pandas oracle (per key in arrival order, a window
at every ``slide``-th record over the last ``size``); snapshot tests restore disk
(and heap) sections at other parallelisms; job tests run real Ray jobs on the disk
backend through savepoints at parallelism 1 -> 2 -> 3 and through a subtask kill
with full and incremental checkpoints.
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
from raystream.engine.windows.count import CountWindowOperator
from raystream.engine.windows.disk_count import KIND, STATE_NAME, DiskCountState
from tests.support.disk import values_by_key
from tests.support.jobs import disk_env, run_through_a_kill, savepoint_chain
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

MAXP = 128
AGGS = {"n": ("count", None), "total": ("sum", "x"), "low": ("min", "y"), "avg": ("mean", "y"),
        "top": ("top_k", ("x", 2)), "best": ("max_by", ("x", "y"))}
WINDOWS = [(5, None), (4, 1), (6, 4), (3, 5), (7, 3)]  # (size, slide): tumbling, sliding


def opt(value) -> tuple:
    """A value that may be null, sortable beside others."""
    return (0,) if value is None or value != value else (1, round(float(value), 9))


def window_row(key, xs: list, ys: list) -> tuple:
    """One window's results in the order of AGGS; nulls in ``ys`` are skipped."""
    valid = [(x, y) for x, y in zip(xs, ys) if y is not None]
    seen = [y for _, y in valid]
    best = min(valid, key=lambda xy: (-xy[1], xy[0]))[0] if valid else None
    return (key, len(xs), opt(sum(xs)), opt(min(seen) if seen else None),
            opt(sum(seen) / len(seen) if seen else None),
            tuple(sorted(xs, reverse=True)[:2]), opt(best))


def count_oracle(df: pd.DataFrame, size: int, slide: int | None) -> list[tuple]:
    slide = slide or size
    out = []
    for key, group in df.groupby("k", sort=False):
        xs = group["x"].tolist()
        ys = [None if pd.isna(y) else int(y) for y in group["y"]]
        for p in range(slide - 1, len(xs), slide):
            lo = max(0, p - size + 1)
            out.append(window_row(key, xs[lo:p + 1], ys[lo:p + 1]))
    return sorted(out)


def result_rows(batches: list[pa.RecordBatch]) -> list[tuple]:
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    return sorted((r["k"], r["n"], opt(r["total"]), opt(r["low"]), opt(r["avg"]),
                   tuple(r["top"]), opt(r["best"])) for r in rows)


def make_input(seed: int, n: int, keys: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = pd.array(rng.integers(0, 20, n), dtype="Int64")
    y[rng.random(n) < 0.2] = pd.NA  # nulls: skipped by min, mean and max_by
    return pd.DataFrame({"k": rng.integers(0, keys, n),
                         "x": rng.integers(-50, 50, n).astype(np.float64), "y": y})


def batches_of(df: pd.DataFrame, seed: int, most: int) -> list[pa.RecordBatch]:
    sizes = np.random.default_rng(seed).integers(1, most, len(df))
    edges = np.concatenate([[0], np.cumsum(sizes)])
    edges = edges[edges < len(df)].tolist() + [len(df)]
    return [pa.RecordBatch.from_pandas(df.iloc[a:b], preserve_index=False)
            for a, b in zip(edges[:-1], edges[1:])]


def count_operator(backend: StateBackend, size: int, slide: int | None, *, index: int = 0,
                   parallelism: int = 1, aggs: dict | None = None) -> CountWindowOperator:
    op = CountWindowOperator("c", KeySelector.of("k"), size=size, slide=slide,
                             spec=AggregateSpec.of(aggs or AGGS))
    op.setup(RuntimeContext("job", "c", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def run(op: CountWindowOperator, batches: list[pa.RecordBatch],
        restored: RestoredState | None = None) -> list[tuple]:
    op.initialize_state(restored)
    op.open()
    for batch in batches:
        op.process_batch(batch)
    return result_rows(op.output.batches)  # pyright: ignore[reportAttributeAccessIssue]


def stored_values(op: CountWindowOperator) -> dict:
    """Key -> stored value bytes of the disk count-window state."""
    return values_by_key(op)


@pytest.mark.parametrize("size,slide", WINDOWS)
def test_disk_count_windows_equal_heap_and_pandas(size, slide):
    df = make_input(seed=size * 10 + (slide or 0), n=1500, keys=30)
    batches = batches_of(df, size, 80)
    heap = run(count_operator(StateBackend.HEAP, size, slide), batches)
    op = count_operator(StateBackend.DISK, size, slide)
    disk = run(op, batches)
    assert disk == heap == count_oracle(df, size, slide)
    assert not op.pending and op.timers.num_keys == 0  # nothing per key on the heap
    assert isinstance(op.backend, DiskKeyedStateBackend)
    assert str(op.backend.state_kind(STATE_NAME)).startswith(KIND + " ")
    values, seen = stored_values(op), df.groupby("k").size()
    assert sorted(values) == sorted(seen.index.tolist())
    if slide is None:  # tumbling: a key whose last window filled is its 8 count bytes
        for key, count in seen.items():
            assert np.frombuffer(values[key][:8], dtype="<i8")[0] == count
            assert (len(values[key]) == 8) == (count % size == 0)


@pytest.mark.parametrize("size,slide", [(300, None), (400, 3)])
def test_keys_with_many_pending_rows_across_many_batches(size, slide):
    df = make_input(seed=size, n=6000, keys=4)
    batches = batches_of(df, size, 40)
    assert len(batches) > 250
    op = count_operator(StateBackend.DISK, size, slide)
    assert run(op, batches) == count_oracle(df, size, slide)
    record = 8 + 8 + 2  # x (float64), y (int64), a validity byte each
    # pending: the rows of the key's next window seen so far (it ends at the next
    # multiple of slide; every key has seen more than size rows)
    pending = {k: (c % size if slide is None else size - slide + c % slide) for k, c in
               df.groupby("k").size().items()}
    assert {k: len(v) for k, v in stored_values(op).items()} == {
        k: 8 + p * record for k, p in pending.items()}


def test_windows_of_count_alone_keep_a_byte_per_pending_row():
    df = make_input(seed=5, n=800, keys=20)
    batches = batches_of(df, 5, 50)
    ops = [count_operator(backend, 6, 4, aggs={"n": ("count", None)})
           for backend in (StateBackend.HEAP, StateBackend.DISK)]
    outputs = []
    for op in ops:
        op.initialize_state(None)
        for batch in batches:
            op.process_batch(batch)
        outputs.append(sorted(pa.Table.from_batches(op.output.batches)  # pyright: ignore
                              .to_pandas().itertuples(index=False)))
    assert outputs[0] == outputs[1] == [(k, n) for k, n, *_ in count_oracle(df, 6, 4)]
    seen = df.groupby("k").size()  # pending: size - slide + count % slide rows, a byte each
    assert {k: len(v) for k, v in stored_values(ops[1]).items()} == {
        k: 8 + 6 - 4 + c % 4 for k, c in seen.items()}


def test_entries_are_keyed_state_under_their_own_state_id(disk_backend):
    """Beside other state of the backend: the backend lists the entries' keys under the
    state's name, and rows of another numeric type are cast to the stored one."""
    backend = disk_backend
    other = backend.value_state("other")
    backend.set_current_key("z")
    other.update(1)
    state = DiskCountState(backend, where="count window 'c'")
    rows = state.conform(pa.table({"x": pa.array([1.5, None, 3.0])}))
    keys = ["a", 7, ("t", 1)]
    groups = np.array([rs.key_group_of(k, MAXP) for k in keys])
    stored = state.entry_keys(keys, groups)
    state.write(stored, np.array([1, 5, 2]), rows, np.array([0, 1, 1, 3]))
    assert sorted(map(str, backend.keys(STATE_NAME))) == sorted(map(str, keys))
    assert list(backend.keys("other")) == ["z"]
    found = state.read(stored)
    assert (found.counts.tolist(), found.lengths.tolist()) == ([1, 5, 2], [1, 0, 2])
    assert found.rows["x"].to_pylist() == [1.5, None, 3.0]
    assert state.conform(pa.table({"x": pa.array([2], pa.int32())}))["x"].type == pa.float64()


def snapshot_midway(backend: StateBackend, size: int, slide: int | None,
                    batches: list[pa.RecordBatch], half: int):
    """Run ``half`` batches, snapshot (the synchronous part), process the rest before
    the asynchronous part runs: (sections, rows before the snapshot, all rows)."""
    op = count_operator(backend, size, slide)
    before = run(op, batches[:half])
    snapshot = op.snapshot_state(1).keyed_state
    assert snapshot is not None
    for batch in batches[half:]:
        op.process_batch(batch)
    return snapshot(), before, result_rows(op.output.batches)  # pyright: ignore


def restore_and_finish(backend: StateBackend, size: int, slide: int | None, sections: dict,
                       rest: pa.Table, parallelism: int) -> list[tuple]:
    """Restore ``sections`` into ``parallelism`` subtasks by key group, feed each the rest
    of its keys' rows: the union of their results."""
    got = []
    for index in range(parallelism):
        groups = rs.key_group_range(index, parallelism, MAXP)
        mine = np.array([rs.key_group_of(k, MAXP) in groups for k in rest["k"].to_pylist()])
        got += run(count_operator(backend, size, slide, index=index, parallelism=parallelism),
                   rest.filter(pa.array(mine)).to_batches(max_chunksize=37),
                   RestoredState(1, [], [(g, s) for g, s in sections.items() if g in groups],
                                 None))
    return sorted(got)


@pytest.mark.parametrize("size,slide", [(5, None), (6, 4)])
def test_disk_snapshot_restores_at_other_parallelism(size, slide):
    """The entries travel in the backend's sections: restored into 1, 2 and 3 subtasks
    the rest of the input gives the uninterrupted run's remaining windows; a heap
    snapshot moves into disk subtasks, and a disk one into heap subtasks."""
    df = make_input(seed=3, n=1200, keys=40)
    batches = batches_of(df, 4, 60)
    half = len(batches) // 2
    rest = pa.Table.from_batches(batches[half:])
    sections, before, whole = snapshot_midway(StateBackend.DISK, size, slide, batches, half)
    assert whole == count_oracle(df, size, slide)
    after = list(whole)
    for row in before:
        after.remove(row)
    for parallelism in (1, 2, 3):
        assert restore_and_finish(StateBackend.DISK, size, slide, sections, rest,
                                  parallelism) == after, parallelism

    heap_sections, heap_before, heap_whole = snapshot_midway(StateBackend.HEAP, size, slide,
                                                             batches, half)
    assert (heap_before, heap_whole) == (before, whole)
    assert restore_and_finish(StateBackend.DISK, size, slide, heap_sections, rest, 2) == after

    for parallelism in (1, 3):  # and a disk snapshot moves into heap subtasks
        assert restore_and_finish(StateBackend.HEAP, size, slide, sections, rest,
                                  parallelism) == after, parallelism


def test_disk_refuses_columns_it_cannot_store_naming_the_window():
    op = count_operator(StateBackend.DISK, 2, None, aggs={"m": ("max", "when")})
    op.initialize_state(None)
    with pytest.raises(TypeError, match="count window 'c': column 'when' is timestamp.*"
                                        "state_backend='heap'"):
        op.process_batch(pa.record_batch({"k": [1, 1], "when": pa.array(
            [1, 2], pa.timestamp("ms"))}))


# -- jobs on Ray ----------------------------------------------------------------------------

TUMBLING, SLIDING = 50, (40, 15)


def events(i: np.ndarray) -> dict:
    return {"user": i % 13, "x": (i % 11).astype(np.float64), "y": (i * 7919) % 97}


def job_oracle(n: int, size: int, slide: int | None) -> list[tuple]:
    e = pd.DataFrame(events(np.arange(n)))
    slide = slide or size
    out = []
    for user, group in e.groupby("user"):
        xs, ys = group["x"].tolist(), group["y"].tolist()
        for p in range(slide - 1, len(xs), slide):
            lo = max(0, p - size + 1)
            out.append((user, len(xs[lo:p + 1]), sum(xs[lo:p + 1]), max(ys[lo:p + 1]),
                        round(sum(ys[lo:p + 1]) / len(ys[lo:p + 1]), 9)))
    return sorted(out)


def job_rows(tables: list[pa.Table]) -> list[tuple]:
    rows = pa.concat_tables(tables).to_pylist()
    return sorted((r["user"], r["n"], r["total"], r["high"], round(r["avg"], 9)) for r in rows)


def count_job(env: rs.StreamEnvironment, n: int):
    """One source split (each key's records reach its subtask in sequence order, in
    every attempt), throttled; a tumbling and a sliding count window."""
    keyed = env.from_sequence(n, events, batch_size=250, num_splits=1).map_batches(
        throttle, name="throttle").key_by("user")
    aggs = {"n": ("count", None), "total": ("sum", "x"), "high": ("max", "y"),
            "avg": ("mean", "y")}
    return (keyed.count_window(TUMBLING).agg(name="tumbling", **aggs).collect(),
            keyed.count_window(*SLIDING).agg(name="sliding", **aggs).collect())


@pytest.mark.slow
def test_disk_count_windows_savepoints_at_1_then_2_restored_at_3(ray_session, tmp_path):
    """Stopped with a savepoint at parallelism 1, restored at 2 and stopped again, restored
    at 3 and run to the end: every window fires exactly once over the three runs."""
    n = 24_000  # 96 throttled batches: the first run is stopped well before its end

    def job(parallelism: int):
        env = disk_env(str(tmp_path / f"chk{parallelism}"), parallelism)
        return env, count_job(env, n)

    results = [(result.table(sinks[0]), result.table(sinks[1]))
               for result, sinks in savepoint_chain(tmp_path, "disk-count", job)]
    assert 0 < results[0][0].num_rows < len(job_oracle(n, TUMBLING, None))  # stopped early
    assert job_rows([t for t, _ in results]) == job_oracle(n, TUMBLING, None)
    assert job_rows([s for _, s in results]) == job_oracle(n, *SLIDING)


@pytest.mark.slow
@pytest.mark.parametrize("incremental", [False, True], ids=["full", "incremental"])
def test_disk_count_windows_exactly_once_through_a_subtask_kill(ray_session, tmp_path,
                                                                incremental):
    n = 12_000
    env = disk_env(str(tmp_path / "chk"), 2, incremental=incremental)
    tumbling, sliding = count_job(env, n)
    job = run_through_a_kill(env, "disk-count-kill", "sliding")
    assert job_rows([job.table(tumbling)]) == job_oracle(n, TUMBLING, None)
    assert job_rows([job.table(sliding)]) == job_oracle(n, *SLIDING)
