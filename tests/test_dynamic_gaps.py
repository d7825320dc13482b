"""Session windows whose gap each record sets (``rs.EventTimeSessionWindows.
with_dynamic_gap``, Flink's ``DynamicEventTimeSessionWindows``): a record at ``ts``
with gap ``g`` has its own window ``[ts, ts + g)``, and windows that meet merge.

Every store of session windows (built-in aggregates' columnar sessions, a user
``AggregateFunction``, a ``ProcessWindowFunction``; heap and disk) is driven with
disordered batches, rows beyond the watermark bound and allowed lateness, and checked
against the plain-Python model of :mod:`tests.chaos.model` given each row's gap; then
through a snapshot restored at another parallelism and on the other backend; bad gaps
are errors naming the window and the record; a job on Ray equals pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.errors import BadRecordError
from raystream.engine.keys import KeySelector
from raystream.engine.windows.join import WindowJoinKind, WindowJoinSpec
from raystream.engine.windows.operator import WindowOperator
from tests.chaos.model import session_run
from tests.chaos.runner import count_and_sum_function
from tests.support.operators import MAXP

BACKENDS = [StateBackend.HEAP, StateBackend.DISK]
KINDS = ["columnar", "aggregate", "process"]
GAPS = np.array([3, 10, 40])  # a row's gap: one of these, by its tier
BATCH, BOUND = 23, 30


function_of = count_and_sum_function


def by_tier(batch: pa.RecordBatch) -> pa.Array:
    """The gap function: tier 0, 1, 2 -> 3, 10, 40 ms."""
    tier = batch["tier"]
    return pc.if_else(pc.equal(tier, 0), 3, pc.if_else(pc.equal(tier, 1), 10, 40))


ASSIGNERS = {"column": rs.EventTimeSessionWindows.with_dynamic_gap("gap"),
             "function": rs.EventTimeSessionWindows.with_dynamic_gap(by_tier)}


def operator(backend: StateBackend, kind: str, assigner, *, lateness: int = 0, index: int = 0,
             parallelism: int = 1) -> WindowOperator:
    op = WindowOperator("w", KeySelector.of("user"), assigner, function=function_of(kind),
                        timestamp="ts", allowed_lateness_ms=lateness, late_output="late")
    op.setup(RuntimeContext("job", "w", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def make_input(seed: int, n: int = 700, keys: int = 6) -> pd.DataFrame:
    """Rows of a few keys, disordered within the watermark bound, every 37th far beyond
    it (late unless it meets an open session); gaps of 3, 10 or 40 ms by tier."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.integers(0, 6, n)) + rng.integers(0, BOUND, n)
    ts[::37] -= 200
    tier = rng.integers(0, 3, n)
    return pd.DataFrame({"user": rng.integers(0, keys, n), "ts": ts, "tier": tier,
                         "gap": GAPS[tier], "x": rng.integers(-9, 10, n).astype(np.float64)})


def watermarks(frame: pd.DataFrame) -> np.ndarray:
    """The watermark each row meets: before each batch, max(ts seen) - BOUND - 1."""
    ts = frame["ts"].to_numpy()
    out, wm, seen = np.empty(len(ts), np.int64), rs.MIN_WATERMARK, -(2 ** 62)
    for i in range(0, len(ts), BATCH):
        out[i:i + BATCH] = wm
        seen = max(seen, int(ts[i:i + BATCH].max()))
        wm = max(wm, seen - BOUND - 1)
    return out


def batch_of(frame: pd.DataFrame) -> pa.RecordBatch:
    return pa.RecordBatch.from_pandas(frame.reset_index(drop=True), preserve_index=False)


def feed(op: WindowOperator, frame: pd.DataFrame, arrival: np.ndarray) -> None:
    """Batches of BATCH rows, each after the watermark its rows meet."""
    for i in range(0, len(frame), BATCH):
        if arrival[i] > op.current_watermark:
            op.process_watermark(int(arrival[i]))
        op.process_batch(batch_of(frame.iloc[i:i + BATCH]))


def emitted(ops: list[WindowOperator]) -> tuple[list[tuple], list[tuple]]:
    """(user, start, end, n, total) of every emission, sorted; the late rows' (user, ts)."""
    rows, late = [], []
    for op in ops:
        out = op.output
        assert isinstance(out, CollectingOutput)
        rows += [(r["user"], r["window_start"], r["window_end"], r["n"], r["total"])
                 for b in out.batches for r in b.to_pylist()]
        late += [(r["user"], r["ts"]) for b in out.side_batches.get("late", [])
                 for r in b.to_pylist()]
    return sorted(rows), sorted(late)


def modelled(frame: pd.DataFrame, arrival: np.ndarray, lateness: int
             ) -> tuple[list[tuple], list[tuple]]:
    numbers = np.arange(len(frame)) // BATCH
    run = session_run(frame["user"], frame["ts"], frame["x"], arrival, numbers,
                      frame["gap"].to_numpy(), lateness)
    return (sorted((k, s, e, len(v), float(sum(v))) for k, s, e, v in run.emissions),
            sorted((k, t) for k, t, _ in run.late))


@pytest.mark.parametrize("gap", list(ASSIGNERS))
@pytest.mark.parametrize("lateness", [0, 25])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_dynamic_gaps_equal_the_model(backend, kind, lateness, gap):
    frame = make_input(seed=lateness + len(kind))
    arrival = watermarks(frame)
    op = operator(backend, kind, ASSIGNERS[gap], lateness=lateness)
    op.initialize_state(None)
    op.open()
    feed(op, frame, arrival)
    op.process_watermark(rs.MAX_WATERMARK)
    expected = modelled(frame, arrival, lateness)
    assert len(expected[0]) > 50 and expected[1]  # sessions of every gap, and late rows
    assert emitted([op]) == expected
    # the gaps matter: one gap for every row would give other sessions
    assert modelled(frame.assign(gap=10), arrival, lateness)[0] != expected[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backends", [(StateBackend.HEAP, StateBackend.HEAP),
                                      (StateBackend.DISK, StateBackend.DISK),
                                      (StateBackend.HEAP, StateBackend.DISK)],
                         ids=lambda b: f"{b[0].value}-to-{b[1].value}")
def test_dynamic_gaps_restore_at_another_parallelism(backends, kind):
    """A snapshot midway, restored into 3 subtasks by key group (heap -> disk too): the
    emissions of both halves are the model's for the whole input."""
    lateness = 25
    frame = make_input(seed=3)
    arrival = watermarks(frame)
    half = (len(frame) // 2) // BATCH * BATCH
    first = operator(backends[0], kind, ASSIGNERS["column"], lateness=lateness)
    first.initialize_state(None)
    first.open()
    feed(first, frame.iloc[:half], arrival[:half])
    keyed = first.snapshot_state(1).keyed_state
    assert keyed is not None
    sections = keyed()
    floors = WatermarkFloors.from_json(first.current_watermark, max_parallelism=MAXP)
    rest, rest_arrival = frame.iloc[half:], arrival[half:]
    ops = []
    for index in range(3):
        groups = rs.key_group_range(index, 3, MAXP)
        op = operator(backends[1], kind, ASSIGNERS["column"], lateness=lateness, index=index,
                      parallelism=3)
        op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                  if g in groups], floors))
        op.open()
        mine = rest["user"].map(lambda k: rs.key_group_of(k, MAXP) in groups).to_numpy()
        # the subtask's rows keep their batches (and so the watermarks they meet)
        for i in range(0, len(rest), BATCH):
            part = rest.iloc[i:i + BATCH][mine[i:i + BATCH]]
            if rest_arrival[i] > op.current_watermark:
                op.process_watermark(int(rest_arrival[i]))
            if len(part):
                op.process_batch(batch_of(part))
        op.process_watermark(rs.MAX_WATERMARK)
        ops.append(op)
    assert emitted([first, *ops]) == modelled(frame, arrival, lateness)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
@pytest.mark.parametrize("gaps, cause", [
    (pa.array([5, 0], pa.int64()), "session gap 0 ms of record"),
    (pa.array([5, -3], pa.int64()), "session gap -3 ms of record"),
    (pa.array([5, None], pa.int64()), "is null"),
    (pa.array([5.0, 1.5]), "expected integer milliseconds"),
])
def test_a_bad_gap_is_an_error_naming_the_window_and_the_record(backend, gaps, cause):
    op = operator(backend, "columnar", ASSIGNERS["column"])
    op.initialize_state(None)
    op.open()
    batch = pa.record_batch({"user": [1, 2], "ts": [10, 11], "gap": gaps, "x": [1.0, 2.0]})
    with pytest.raises(BadRecordError, match=cause) as raised:
        op.process_batch(batch)
    assert "window 'w'" in str(raised.value)
    if gaps.type == pa.int64() and gaps.null_count == 0:
        assert "'user': 2" in str(raised.value)  # the record with the bad gap
    missing = pa.record_batch({"user": [1], "ts": [10], "x": [1.0]})
    with pytest.raises(BadRecordError, match="session gap column 'gap' is missing"):
        op.process_batch(missing)
    # nothing of the refused batches was kept
    op.process_watermark(rs.MAX_WATERMARK)
    assert emitted([op]) == ([], [])


def test_a_gap_function_that_fails_names_the_window():
    def broken(batch):
        raise KeyError("tier")
    op = operator(StateBackend.HEAP, "aggregate",
                  rs.EventTimeSessionWindows.with_dynamic_gap(broken))
    op.initialize_state(None)
    with pytest.raises(BadRecordError, match="window 'w': the session gap function failed"):
        op.process_batch(pa.record_batch({"user": [1], "ts": [10], "x": [1.0]}))


def test_window_joins_refuse_dynamic_gaps():
    with pytest.raises(ValueError, match="dynamic gap cannot join"):
        WindowJoinSpec(WindowJoinKind.JOIN, ASSIGNERS["column"],
                       (KeySelector.of("k"), KeySelector.of("k")), ("ts", "ts"))


BASE = 1_700_000_000_000


def events(i: np.ndarray) -> dict:
    """Users 0..4; every user's records 0..9 ms apart in bursts, out of order within the
    bound; a user's gap is 20 ms (odd users) or 200 ms (even ones)."""
    user = i % 5
    return {"user": user, "ts": BASE + (i // 5) * 7 + (i * 7919) % 50 + (i // 300) * 400,
            "gap": np.where(user % 2, 20, 200), "x": (i % 11).astype(np.float64)}


def pandas_sessions(frame: pd.DataFrame) -> pd.DataFrame:
    """Per user, rows by time; a row starts a new session when it comes after the end
    (ts + gap) of every row of the session before."""
    out = []
    for user, rows in frame.sort_values("ts", kind="stable").groupby("user"):
        end = None
        for t, g, x in zip(rows["ts"], rows["gap"], rows["x"]):
            if end is None or t > end:
                out.append([user, t, t + g, 1, x])
            else:
                out[-1][2], out[-1][3], out[-1][4] = max(end, t + g), out[-1][3] + 1, out[-1][4] + x
            end = out[-1][2]
    return pd.DataFrame(out, columns=["user", "window_start", "window_end", "n", "total"])


@pytest.mark.slow
def test_a_job_of_dynamic_gaps_equals_pandas(ray_session):
    n = 6000
    env = rs.StreamEnvironment(parallelism=2)
    src = env.from_sequence(n, events, watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=60))
    # a gap column (kept by the column pruning before the shuffle) and a gap function
    sinks = [src.key_by("user").window(rs.EventTimeSessionWindows.with_dynamic_gap(gap),
                                       timestamp="ts").agg(n=("count", None), total=("sum", "x"))
             .collect() for gap in ("gap", lambda batch: batch["gap"])]
    job = env.execute("dynamic-gaps")
    expected = pandas_sessions(pd.DataFrame(events(np.arange(n))))
    assert len(expected) > 20
    for sink in sinks:
        got = (job.table(sink).to_pandas()[["user", "window_start", "window_end", "n", "total"]]
               .sort_values(["user", "window_start"]).reset_index(drop=True))
        pd.testing.assert_frame_equal(got, expected.sort_values(["user", "window_start"])
                                      .reset_index(drop=True), check_dtype=False)
