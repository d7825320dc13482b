"""Session windows of built-in aggregates on the disk state backend: a key's open
sessions in RocksDB, against pandas.

Operator-level tests drive a heap and a disk :class:`WindowOperator` with the same
batches and watermarks (disorder, rows beyond the bound, allowed lateness) and check
both against a pandas oracle (per key, the rows kept on arrival split where two
consecutive times are more than the gap apart); a version 2 heap checkpoint's sessions
move into RocksDB; a job test runs a real Ray job on the disk backend with incremental
checkpoints through a subtask kill. (Sessions restored at other parallelisms, on either
backend: tests/test_windows.py.)
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.engine.keys import KeySelector
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.disk_sessions import KIND, STATE_NAME
from raystream.engine.windows.functions import BuiltinAggregates
from raystream.engine.windows.operator import WindowOperator
from raystream.engine.windows.session_windows import DiskSessionWindows
from tests.chaos.model import SessionRun
from tests.support.disk import values_by_key
from tests.support.functions import AGGS
from tests.support.inputs import BLOCK, JOB_GAP, make_input, session_events, session_input
from tests.support.jobs import disk_env, run_through_a_kill
from tests.support.operators import (GAP, MAXP, SESSIONS, drive, heap_and_disk_sessions,
                                     window_operator)
from tests.support.oracles import WINDOW_KEYS, final_sessions
from tests.support.pacing import Throttle

throttle = Throttle(0.03)


def sessions_oracle(frame: pd.DataFrame, gap: int, key: str = "k") -> pd.DataFrame:
    """pandas: per key, rows by time, a new session where the time is more than ``gap``
    after the one before (sessions that touch merge)."""
    frame = frame.sort_values([key, "ts"], kind="stable")
    new = (frame[key].diff() != 0) | (frame["ts"].diff() > gap)
    frame = frame.assign(session=new.cumsum())
    out = frame.groupby([key, "session"]).agg(
        window_start=("ts", "min"), last=("ts", "max"), n=("x", "size"), total=("x", "sum"),
        low=("x", "min"), high=("x", "max"), avg=("x", "mean")).reset_index()
    out["window_end"] = out["last"] + gap
    return out.loc[:, [key, "window_start", "window_end", *AGGS]]


def stored_sessions(op: WindowOperator) -> dict:
    """Key -> number of open sessions of the disk session state."""
    values = values_by_key(op)
    if not values:
        return {}
    store = op.store
    assert isinstance(store, DiskSessionWindows) and store.disk.record is not None
    return {k: len(v) // store.disk.record.itemsize for k, v in values.items()}


def by_rows(frame: pd.DataFrame) -> pd.DataFrame:
    columns = [*WINDOW_KEYS, *AGGS]
    return frame.loc[:, columns].sort_values(by=columns).reset_index(drop=True)


def model_rows(run: SessionRun) -> pd.DataFrame:
    """The model's emissions with the aggregates of their rows' values."""
    return pd.DataFrame([
        {"k": k, "window_start": s, "window_end": e, "n": len(v), "total": sum(v),
         "low": min(v), "high": max(v), "avg": sum(v) / len(v)} for k, s, e, v in run.emissions])


def assert_model_rows(got: pd.DataFrame, run: SessionRun) -> None:
    """Every emission (re-firings included) as the model makes it."""
    got, want = by_rows(got), by_rows(model_rows(run))
    assert got[WINDOW_KEYS + ["n"]].astype(np.int64).equals(
        want[WINDOW_KEYS + ["n"]].astype(np.int64))
    for column in ("total", "low", "high", "avg"):
        np.testing.assert_allclose(got[column], want[column])


@pytest.mark.parametrize("lateness, straggle", [(0, 300), (30, 300), (0, 80), (30, 80)])
def test_disk_sessions_equal_heap_sessions_and_the_model(lateness, straggle):
    key, ts, x = session_input(seed=lateness + 1, n=1500, keys=8, jitter=19 + lateness,
                               straggle=straggle)
    op, disk, run, arrival = heap_and_disk_sessions(
        lambda backend: window_operator(backend, SESSIONS, lateness=lateness), key, ts, x,
        lateness)
    assert isinstance(op.store, DiskSessionWindows)  # nothing on the heap
    assert str(op.backend.state_kind(STATE_NAME)).startswith(KIND + " ")  # pyright: ignore
    assert_model_rows(disk, run)
    final = by_rows(final_sessions(disk))
    if lateness:
        assert len(disk) > len(final)  # some sessions fired again
    else:
        assert len(disk) == len(final)
    # the rows late by their own window: at 80 ms back some join an open session
    own_late = int(np.count_nonzero(ts + GAP - 1 + lateness <= np.array(arrival)))
    assert own_late > 5, "the input must hold rows beyond the bound"
    assert (own_late > len(run.late)) == (straggle == 80)  # at 80 ms some rows are kept


def test_picking_aggregates_of_sessions_on_disk_equal_the_heap():
    """max_by and top_k: their partials are fixed-width columns of the record too."""
    aggs = {"top": ("top_k", ("x", 2)), "best": ("max_by", ("x", "ts")), "n": ("count", None)}
    key, ts, x = make_input(seed=9, n=400, keys=8, disorder=60)
    outputs = []
    for backend in (StateBackend.HEAP, StateBackend.DISK):
        op = WindowOperator("w", KeySelector.of("k"), SESSIONS,
                            function=BuiltinAggregates(AggregateSpec.of(aggs)), timestamp="ts",
                            allowed_lateness_ms=10, late_output="late")
        op.setup(RuntimeContext("job", "w", 0, 1, MAXP, 0, state_backend=backend),
                 CollectingOutput())
        rows, _, late = drive(op, key, ts, x)
        outputs.append((rows.astype(str), late))
    assert len(outputs[0][0])
    pd.testing.assert_frame_equal(outputs[0][0], outputs[1][0])
    pd.testing.assert_frame_equal(outputs[0][1], outputs[1][1])


def test_sessions_merge_across_batches_in_one_entry_per_key():
    """Sessions of separate batches that a later row bridges become one record; a key's
    entry holds all its open sessions and goes when the last one fires."""
    op = window_operator(StateBackend.DISK, SESSIONS)
    op.initialize_state(None)
    op.process_batch(pa.record_batch({"k": [1, 1, 2], "ts": [100, 130, 100],
                                      "x": [1.0, 2.0, 3.0]}))
    op.process_batch(pa.record_batch({"k": [1, 1], "ts": [170, 102], "x": [4.0, 5.0]}))
    assert stored_sessions(op) == {1: 3, 2: 1}  # [100, 117), [130, 145), [170, 185)
    op.process_batch(pa.record_batch({"k": [1], "ts": [116], "x": [6.0]}))  # bridges two
    assert stored_sessions(op) == {1: 2, 2: 1}
    op.process_watermark(150)  # fires [100, 145) of key 1 and [100, 115) of key 2
    assert stored_sessions(op) == {1: 1}
    op.process_watermark(rs.MAX_WATERMARK)
    assert stored_sessions(op) == {}
    got = pa.Table.from_batches(op.output.batches).to_pylist()  # pyright: ignore
    assert sorted((r["k"], r["window_start"], r["window_end"], r["n"], r["total"])
                  for r in got) == [(1, 100, 145, 4, 14.0), (1, 170, 185, 1, 4.0),
                                    (2, 100, 115, 1, 3.0)]


def test_sessions_of_a_version_2_heap_checkpoint_move_into_rocksdb():
    """Version 2 kept a session of built-in aggregates as one accumulator dict: a disk job
    moves them into the key's entry."""
    spec = AggregateSpec.of({"n": ("count", None), "total": ("sum", "x")})
    op = WindowOperator("s", KeySelector.of("k"), rs.EventTimeSessionWindows(gap_ms=10),
                        function=BuiltinAggregates(spec), timestamp="ts")
    out = CollectingOutput()
    op.setup(RuntimeContext("job", "s", 0, 1, MAXP, 0, state_backend=StateBackend.DISK), out)
    op.initialize_state(None)
    group = rs.key_group_of(7, MAXP)
    blob = pickle.dumps((2, {"dense": None, "generic": [
        (7, 100, 115, {"__n.n": 3, "__total.sum": 6.0}),
        (7, 200, 210, {"__n.n": 1, "__total.sum": 1.0})]}))
    op.restore_keyed_parts({"windows": [(group, blob)]})
    assert stored_sessions(op) == {7: 2}
    # a row at 112 extends the first session to 122 (and registers its timer)
    op.process_batch(pa.record_batch({"k": [7], "ts": [112], "x": [4.0]}))
    op.process_watermark(150)
    assert pa.Table.from_batches(out.batches).to_pylist() == [
        {"k": 7, "window_start": 100, "window_end": 122, "n": 4, "total": 10.0}]
    assert stored_sessions(op) == {7: 1}


# -- a job on Ray ---------------------------------------------------------------------------

def test_disk_sessions_exactly_once_through_a_subtask_kill(ray_session, tmp_path):
    n = 20_000
    env = disk_env(str(tmp_path / "chk"), incremental=True)
    src = env.from_sequence(n, session_events, batch_size=250,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=50))
    sink = src.map_batches(throttle, name="throttle").key_by("user").window(
        rs.EventTimeSessionWindows(gap_ms=JOB_GAP), timestamp="ts").agg(**AGGS).collect()
    job = run_through_a_kill(env, "disk-sessions-kill", "window")
    got = job.table(sink).to_pandas().rename(columns={"user": "k"})
    expected = sessions_oracle(pd.DataFrame(session_events(np.arange(n))).rename(
        columns={"user": "k"}), JOB_GAP)
    assert len(expected) == 7 * -(-n // BLOCK)
    got, expected = by_rows(got), by_rows(expected)
    assert got[WINDOW_KEYS + ["n"]].astype(np.int64).equals(
        expected[WINDOW_KEYS + ["n"]].astype(np.int64))
    for column in ("total", "low", "high", "avg"):
        np.testing.assert_allclose(got[column], expected[column])
