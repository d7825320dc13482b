"""Late rows of session windows and session joins: a row whose own window
``[ts, ts + gap)`` is late still counts when it meets a session of its key that is
not late (Flink merges first, then drops only a late merged session).

Operator-level tests drive heap and disk operators (built-in aggregates, a user
``AggregateFunction``, a ``ProcessWindowFunction``, joins and co-groups) with
hand-made batches whose every emission is written out below and also checked
against the plain-Python model of :mod:`tests.chaos.model`; job tests run on Ray
through a stop-with-savepoint chain (heap and disk) and compare with that model.
"""

from __future__ import annotations

import collections

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
from raystream.engine.windows.join import WindowJoinKind
from raystream.engine.windows.operator import WindowOperator
from tests.chaos.model import session_run, watermarks_before
from tests.chaos.runner import count_and_sum_function
from tests.support.functions import co_groups
from tests.support.jobs import disk_env, savepoint_chain
from tests.support.operators import MAXP, window_join_operator, window_rows
from tests.support.oracles import fed_sessions
from tests.support.pacing import Throttle

throttle = Throttle(0.03)

GAP = 10
BACKENDS = [StateBackend.HEAP, StateBackend.DISK]
KINDS = ["columnar", "aggregate", "process"]


function_of = count_and_sum_function


def operator(backend: StateBackend, kind: str, *, lateness: int = 0) -> WindowOperator:
    op = WindowOperator("w", KeySelector.of("user"), rs.EventTimeSessionWindows(gap_ms=GAP),
                        function=function_of(kind), timestamp="ts",
                        allowed_lateness_ms=lateness, late_output="late")
    op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def started(op: WindowOperator, restored: RestoredState | None = None) -> WindowOperator:
    op.initialize_state(restored)
    op.open()
    return op


def batch(user: list[int], ts: list[int], x: list[float]) -> pa.RecordBatch:
    return pa.record_batch({"user": pa.array(user, pa.int64()), "ts": pa.array(ts, pa.int64()),
                            "x": pa.array(x, pa.float64())})


def emitted(op: WindowOperator) -> list[tuple]:
    """(user, window start, window end, n, total) of every emission, in order."""
    output = op.output
    assert isinstance(output, CollectingOutput)
    return [(r["user"], r["window_start"], r["window_end"], r["n"], r["total"])
            for b in output.batches for r in b.to_pylist()]


def late_of(op: WindowOperator) -> list[tuple]:
    output = op.output
    assert isinstance(output, CollectingOutput)
    return sorted((r["user"], r["ts"]) for b in output.side_batches.get("late", [])
                  for r in b.to_pylist())


def modelled(batches: list[tuple[pa.RecordBatch, int]], lateness: int = 0
             ) -> tuple[list[tuple], list[tuple]]:
    """The model's emissions (sorted) and late rows over (batch, watermark it meets)."""
    rows = pa.Table.from_batches([b for b, _ in batches]).to_pydict()
    arrival = [w for b, w in batches for _ in range(b.num_rows)]
    numbers = [i for i, (b, _) in enumerate(batches) for _ in range(b.num_rows)]
    run = session_run(rows["user"], rows["ts"], rows["x"], arrival, numbers, GAP, lateness)
    return (sorted((k, s, e, len(v), sum(v)) for k, s, e, v in run.emissions),
            sorted((k, t) for k, t, _ in run.late))


# the example: key 1's open session [0, 34) at watermark 20, key 2's [20, 38), key 3's
# [0, 10) fired and purged at 20
OPEN = batch([1, 1, 1, 1, 2, 2, 3], [0, 8, 16, 24, 20, 28, 0], [1.0] * 7)
# rows whose own windows are late at 20: 5 inside key 1's session; 10 touching key 2's
# start (its window [10, 20) ends where the session starts: it moves the start to 10);
# 9 meets only that late row's window, not the session: late (rows of a batch are judged
# together, against the sessions the batch found); key 3's 5 meets only its purged session
LATE = batch([1, 2, 2, 3], [5, 10, 9, 5], [10.0, 100.0, 1000.0, 5.0])
FIRED_BEFORE = [(3, 0, 10, 1, 1.0)]
FIRED_AFTER = [(1, 0, 34, 5, 14.0), (2, 10, 38, 3, 102.0)]
LATE_ROWS = [(2, 9), (3, 5)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]])
def test_a_late_row_inside_an_open_session_counts(backend, kind, order):
    op = started(operator(backend, kind))
    op.process_batch(OPEN)
    op.process_watermark(20)
    op.process_batch(LATE.take(pa.array(order)))
    op.process_watermark(rs.MAX_WATERMARK)
    assert sorted(emitted(op)) == sorted(FIRED_BEFORE + FIRED_AFTER)
    assert late_of(op) == LATE_ROWS
    assert op.metrics()["late_records_side_output"] == 2
    assert modelled([(OPEN, rs.MIN_WATERMARK), (LATE, 20)]) == (
        sorted(FIRED_BEFORE + FIRED_AFTER), LATE_ROWS)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_dropped_without_a_late_output_are_counted(backend, kind):
    op = WindowOperator("w", KeySelector.of("user"), rs.EventTimeSessionWindows(gap_ms=GAP),
                        function=function_of(kind), timestamp="ts")
    op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
             CollectingOutput())
    started(op).process_batch(OPEN)
    op.process_watermark(20)
    op.process_batch(LATE)
    op.process_watermark(rs.MAX_WATERMARK)
    assert sorted(emitted(op)) == sorted(FIRED_BEFORE + FIRED_AFTER)
    assert op.metrics()["late_records_dropped"] == 2


def memtable_entries(op) -> int:
    """RocksDB's own count of the puts and deletes in the operator's active memtable."""
    backend = op.backend
    assert isinstance(backend, DiskKeyedStateBackend)
    return int(backend.raw_db.property_int_value("rocksdb.num-entries-active-mem-table"))


@pytest.mark.parametrize("kind", KINDS)
def test_keys_whose_rows_are_all_late_are_loaded_but_not_written_back(kind):
    """50 keys' sessions are open at watermark 150; a batch brings each key a late row
    that meets none of them (dropped) and key 0 a row inside its session: the batch
    loads all 50 keys to judge their rows, but writes back (RocksDB's own count of
    the entries it put) only key 0's and its timers, not 49 unchanged ones."""
    keys = list(range(50))
    op = started(operator(StateBackend.DISK, kind))
    batches = [(batch(keys, [200] * 50, [1.0] * 50), rs.MIN_WATERMARK),
               (batch([*keys, 0], [100] * 50 + [205], [2.0] * 50 + [3.0]), 150)]
    op.process_batch(batches[0][0])
    op.process_watermark(150)
    written = memtable_entries(op)
    op.process_batch(batches[1][0])
    written = memtable_entries(op) - written
    assert 1 <= written <= 4  # key 0: its header, a chunk (process), its timers (was 51-53)
    op.process_watermark(rs.MAX_WATERMARK)
    assert (sorted(emitted(op)), late_of(op)) == modelled(batches)
    assert sorted(emitted(op))[:2] == [(0, 200, 215, 2, 4.0), (1, 200, 210, 1, 1.0)]
    assert len(late_of(op)) == 50


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("first, then", [(StateBackend.HEAP, StateBackend.HEAP),
                                         (StateBackend.DISK, StateBackend.DISK),
                                         (StateBackend.HEAP, StateBackend.DISK)],
                         ids=["heap", "disk", "heap-to-disk"])
def test_a_restore_between_the_open_session_and_the_late_row(first, then, kind):
    """The open sessions come back from the snapshot and still take the late rows in;
    the purged one does not come back."""
    op = started(operator(first, kind))
    op.process_batch(OPEN)
    op.process_watermark(20)
    assert emitted(op) == FIRED_BEFORE
    snapshot = op.snapshot_state(1).keyed_state
    assert snapshot is not None
    sections = snapshot()
    restored = started(operator(then, kind), RestoredState(
        1, [], list(sections.items()), WatermarkFloors.from_json(20, max_parallelism=MAXP)))
    restored.process_batch(LATE)
    restored.process_watermark(rs.MAX_WATERMARK)
    assert sorted(emitted(restored)) == FIRED_AFTER
    assert late_of(restored) == LATE_ROWS


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_allowed_lateness_fires_a_session_again_for_a_late_row_it_takes_in(backend, kind):
    """Lateness 20: session [0, 18) fires at 20 and is kept until 37. At 30 a row at 1
    (own window [1, 11): 10 + 20 <= 30, late) joins it and it fires again; a row at -5
    moves its start to -5 and it fires again as [-5, 18); after 40 it is gone and a row
    at 3 is late."""
    op = started(operator(backend, kind, lateness=20))
    steps = [(batch([1, 1], [0, 8], [1.0, 1.0]), 20), (batch([1], [1], [10.0]), 30),
             (batch([1], [-5], [100.0]), 40), (batch([1], [3], [7.0]), rs.MAX_WATERMARK)]
    arrival = rs.MIN_WATERMARK
    for rows, watermark in steps:
        op.process_batch(rows)
        op.process_watermark(watermark)
    expected = [(1, 0, 18, 2, 2.0), (1, 0, 18, 3, 12.0), (1, -5, 18, 4, 112.0)]
    assert emitted(op) == expected
    assert late_of(op) == [(1, 3)]
    fed = []
    for rows, watermark in steps:
        fed.append((rows, arrival))
        arrival = watermark
    assert modelled(fed, lateness=20) == (sorted(expected), [(1, 3)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lateness", [0, 15])
def test_rows_in_any_order_within_batches_give_the_same_result(kind, lateness):
    """Random sessions with stragglers inside and outside open sessions: every order of
    the rows within each batch gives the same emissions and late rows, on the heap and
    on disk, and the model's."""
    rng = np.random.default_rng(lateness + len(kind))
    n, size = 1200, 40
    user = rng.integers(0, 6, n)
    ts = np.cumsum(rng.integers(0, 3, n)) + rng.integers(0, 6, n)
    stragglers = rng.random(n) < 0.08
    ts[stragglers] -= rng.integers(20, 90, int(stragglers.sum()))
    x = rng.integers(-9, 9, n).astype(np.float64)
    batches = [batch(user[a:a + size].tolist(), ts[a:a + size].tolist(),
                     x[a:a + size].tolist()) for a in range(0, n, size)]
    arrival, seen, fed = rs.MIN_WATERMARK, rs.MIN_WATERMARK, []
    for rows in batches:
        fed.append((rows, arrival))
        seen = max(seen, max(rows["ts"].to_pylist()))
        arrival = max(arrival, seen - 8)
    expected = modelled(fed, lateness)
    own_late = sum(t + GAP - 1 + lateness <= w for rows, w in fed for t in rows["ts"].to_pylist())
    assert own_late > len(expected[1]) > 5  # rows late by their own window kept, and not
    for backend in BACKENDS:
        for seed in range(3):
            shuffle = np.random.default_rng(seed)
            op = started(operator(backend, kind, lateness=lateness))
            for (rows, _), (_, after) in zip(fed, fed[1:] + [(None, rs.MAX_WATERMARK)]):
                op.process_batch(rows.take(pa.array(shuffle.permutation(rows.num_rows))))
                op.process_watermark(after)
            assert (sorted(emitted(op)), late_of(op)) == expected, (backend, seed)


# -- joins ----------------------------------------------------------------------------------

JOIN_GAP = 10


def join_batch(k: list[int], ts: list[int], ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(ids, pa.int64()), "k": pa.array(k, pa.int64()),
                            "ts": pa.array(ts, pa.int64())})


# key 1: left 0, 8, 16, 24 and right 20 make [0, 34) at watermark 20; late rows at 5
# (left) and 3 (right) join it. Key 2: [0, 12) fires at 20; a right row at 5 is late.
# Key 3: [20, 35); a left row at 10 touches its start and moves it to 10.
JOIN_OPEN = (join_batch([1, 1, 1, 1, 2, 3], [0, 8, 16, 24, 0, 20], [1, 2, 3, 4, 8, 11]),
             join_batch([1, 2, 3], [20, 2, 25], [5, 9, 12]))
JOIN_LATE = (join_batch([1, 3], [5, 10], [6, 13]), join_batch([1, 2], [3, 5], [7, 10]))


def join_expected(kind: WindowJoinKind) -> list:
    sessions = [(1, 0, 34, (1, 2, 3, 4, 6), (5, 7)), (2, 0, 12, (8,), (9,)),
                (3, 10, 35, (11, 13), (12,))]
    if kind is WindowJoinKind.CO_GROUP:
        return sorted(sessions)
    return sorted((left, right, start, end) for _, start, end, lefts, rights in sessions
                  for left in lefts for right in rights)


@pytest.mark.parametrize("kind", list(WindowJoinKind), ids=lambda k: k.value)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_late_rows_of_either_side_join_an_open_session(backend, kind):
    op = window_join_operator(backend, rs.EventTimeSessionWindows(gap_ms=JOIN_GAP), kind,
                              co_groups if kind is WindowJoinKind.CO_GROUP else None)
    op.initialize_state(None)
    op.open()
    for side, rows in enumerate(JOIN_OPEN):
        op.process_batch(rows, side)
    op.process_watermark(20)
    for side, rows in enumerate(JOIN_LATE):
        op.process_batch(rows, side)
    op.process_watermark(rs.MAX_WATERMARK)
    assert window_rows(op, kind) == join_expected(kind)
    metrics = op.metrics()
    assert metrics["late_records_dropped"] == metrics["late_right_dropped"] == 1
    # the model over both sides' rows: the same sessions, the same late row
    frame = pd.concat([pa.Table.from_batches([rows]).to_pandas().assign(
        side=side, call=call, wm=wm) for call, (side, rows, wm) in enumerate(
        [(0, JOIN_OPEN[0], rs.MIN_WATERMARK), (1, JOIN_OPEN[1], rs.MIN_WATERMARK),
         (0, JOIN_LATE[0], 20), (1, JOIN_LATE[1], 20)])], ignore_index=True)
    sessions = fed_sessions(frame, JOIN_GAP)
    assert frame["id"][sessions["window_start"].isna()].tolist() == [10]


def test_a_session_join_writes_no_key_whose_rows_are_all_late():
    """As for session windows: 50 keys' sessions open at watermark 150, a left batch of
    a late row each that meets none (dropped) and one of key 0's inside its session:
    the batch writes (RocksDB's own count) key 0's chunk, header and timer only."""
    keys = list(range(50))
    op = window_join_operator(StateBackend.DISK, rs.EventTimeSessionWindows(gap_ms=JOIN_GAP))
    op.initialize_state(None)
    op.open()
    op.process_batch(join_batch(keys, [200] * 50, keys), 0)
    op.process_batch(join_batch(keys, [205] * 50, [100 + k for k in keys]), 1)
    op.process_watermark(150)
    written = memtable_entries(op)
    op.process_batch(join_batch([*keys, 0], [100] * 50 + [205],
                                [1000 + k for k in keys] + [999]), 0)
    assert memtable_entries(op) - written <= 3
    op.process_watermark(rs.MAX_WATERMARK)
    assert window_rows(op, WindowJoinKind.JOIN) == sorted(
        [(k, 100 + k, 200, 215) for k in keys] + [(999, 100, 200, 215)])
    assert op.metrics()["late_records_dropped"] == 50


# -- jobs on Ray ----------------------------------------------------------------------------

N, BATCH, BOUND, JOB_GAP, USERS = 20_000, 250, 50, 100, 5  # 80 batches: 2.4 s throttled


def straggling_events(i: np.ndarray) -> dict:
    """Five users, a row every 10 ms each, a 2 s pause every 1000 rows (one session per
    user and block); every 50th row 1 s back: inside its user's open session, or early
    in a block before it (then late)."""
    return {"user": i % USERS, "ts": 1_000_000 + i * 2 + (i // 1000) * 2000
            - np.where(i % 50 == 17, 1000, 0), "x": (i % 7).astype(np.float64)}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_late_rows_in_open_sessions_through_savepoints(ray_session, tmp_path, backend):
    """Stopped with a savepoint at parallelism 1 and 2 and restored at 2 and 3: every
    session (and the late output) as the model makes them, late rows in sessions
    open at a savepoint included."""
    def job(parallelism: int):
        storage = str(tmp_path / f"c{parallelism}")
        env = (disk_env(storage, parallelism) if backend is StateBackend.DISK
               else rs.StreamEnvironment(parallelism=parallelism, checkpoints=rs.CheckpointConfig(
                   interval_s=0.2, storage=storage)))
        source = env.from_sequence(N, straggling_events, batch_size=BATCH, num_splits=1,
                                   parallelism=1,
                                   watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=BOUND))
        windowed = source.map_batches(throttle, name="throttle", parallelism=1).key_by(
            "user").window(rs.EventTimeSessionWindows(gap_ms=JOB_GAP), timestamp="ts",
                           late_output="late").agg(n=("count", None), total=("sum", "x"))
        return env, (windowed.collect(), windowed.side_output("late").collect(name="late"))

    runs = savepoint_chain(tmp_path, f"late-sessions-{backend.value}", job)
    rows = [r for result, (sink, _) in runs for r in result.table(sink).to_pylist()]
    late = sorted((r["user"], r["ts"]) for result, (_, sink) in runs
                  for r in result.table(sink).to_pylist())
    e = straggling_events(np.arange(N))
    run = session_run(e["user"], e["ts"], e["x"], watermarks_before(e["ts"], BATCH, BOUND),
                      BATCH, JOB_GAP, 0)
    got = collections.Counter((r["user"], r["window_start"], r["window_end"], r["n"],
                               r["total"]) for r in rows)
    want = collections.Counter((k, s, e_, len(v), sum(v)) for k, s, e_, v in run.emissions)
    assert got == want, (f"missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}; "
                         f"runs: {[len(result.table(sink)) for result, (sink, _) in runs]}")
    assert late == sorted((k, t) for k, t, _ in run.late)
    own_late = int(np.count_nonzero(e["ts"] + JOB_GAP - 1 <= watermarks_before(
        e["ts"], BATCH, BOUND)))
    assert own_late > len(run.late) > 0  # rows late by their own window kept, and not
