"""Operators driven by hand on either keyed-state backend: built with a runtime context
of ``MAXP`` key groups, fed batches and watermarks in a fixed order (so which rows are
late is exact), snapshotted midway and restored at other parallelisms, and their
output read back in a form the oracles of tests/support/oracles.py compare with."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.functions import (BuiltinAggregates, ProcessWindow, UserAggregate,
                                                WindowFunction)
from raystream.engine.windows.join import WindowJoinKind, WindowJoinOperator, WindowJoinSpec
from raystream.engine.windows.operator import WindowOperator
from tests.chaos.model import SessionRun, session_run
from tests.support.disk import values_by_key
from tests.support.functions import AGGS, Average, Spread
from tests.support.oracles import fed_sessions, is_late

MAXP = 128  # the key groups of the operators built here

# -- window operators -------------------------------------------------------------------------

def window_operator(backend: StateBackend, assigner, *, lateness: int = 0, index: int = 0,
                    parallelism: int = 1) -> WindowOperator:
    """A window of the built-in ``AGGS`` over key ``k``, time ``ts``, late rows to ``late``."""
    op = WindowOperator("w", KeySelector.of("k"), assigner,
                        function=BuiltinAggregates(AggregateSpec.of(AGGS)), timestamp="ts",
                        allowed_lateness_ms=lateness, late_output="late")
    op.setup(RuntimeContext("job", "w", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def function_of(kind: str) -> WindowFunction:
    """``aggregate``: :class:`Average`; ``process``: :class:`Spread`."""
    if kind == "aggregate":  # Average names its parameters its own way
        return UserAggregate(Average(), "result")  # pyright: ignore[reportArgumentType]
    return ProcessWindow(Spread())


def user_operator(backend: StateBackend, assigner, kind: str, *, lateness: int = 0,
                  index: int = 0, parallelism: int = 1) -> WindowOperator:
    """:func:`window_operator` with the user function of ``kind`` (:func:`function_of`)."""
    op = WindowOperator("w", KeySelector.of("k"), assigner, function=function_of(kind),
                        timestamp="ts", allowed_lateness_ms=lateness, late_output="late")
    op.setup(RuntimeContext("job", "w", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def feed(op, key, ts, x, *, batch: int, lag: int) -> list[int]:
    """Open ``op`` and feed it batches of ``(k, ts, x)``; after each the watermark is
    max(ts seen) - lag - 1, then MAX_WATERMARK at the end. Returns the watermark each
    input row saw on arrival."""
    op.initialize_state(None)
    op.open()
    wm, seen, arrival = rs.MIN_WATERMARK, -(2 ** 62), []
    for i in range(0, len(ts), batch):
        sl = slice(i, i + batch)
        op.process_batch(pa.record_batch({"k": key[sl], "ts": ts[sl], "x": x[sl]}))
        arrival += [wm] * len(ts[sl])
        seen = max(seen, int(ts[sl].max()))
        if seen - lag - 1 > wm:
            wm = seen - lag - 1
            op.process_watermark(wm)
    op.process_watermark(rs.MAX_WATERMARK)
    return arrival


def drive(op: WindowOperator, key, ts, x, *, batch: int = 25, lag: int = 20
          ) -> tuple[pd.DataFrame, list[int], pd.DataFrame]:
    """:func:`feed` a set-up operator. Returns the output rows, the watermark each input
    row saw on arrival, and the late rows."""
    arrival = feed(op, key, ts, x, batch=batch, lag=lag)
    out = op.output
    assert isinstance(out, CollectingOutput)
    late = (pa.Table.from_batches(out.side_batches["late"]).to_pandas()
            if "late" in out.side_batches else pd.DataFrame({"k": [], "ts": [], "x": []}))
    return pa.Table.from_batches(out.batches).to_pandas(), arrival, late


def last_per_window(results: pd.DataFrame) -> pd.DataFrame:
    """A window fired again (a row within the allowed lateness) replaces its result."""
    return (results.drop_duplicates(["k", "window_start", "window_end"], keep="last")
            .sort_values(["k", "window_start"]).reset_index(drop=True))


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a window of ``AGGS``, sorted."""
    columns = ["k", "window_start", "window_end", *AGGS]
    return frame.loc[:, columns].sort_values(by=columns).reset_index(drop=True)


COLUMNS = ["k", "window_start", "window_end", "rows", "value"]


def normalized(frame: pd.DataFrame) -> pd.DataFrame:
    """Result rows of :func:`function_of`'s functions as (k, window_start, window_end,
    rows, value), sorted."""
    value = next(c for c in ("avg", "spread", "value") if c in frame.columns)
    out = pd.DataFrame({name: frame[value if name == "value" else name].to_numpy(
        np.float64 if name == "value" else np.int64) for name in COLUMNS})
    return out.sort_values(by=COLUMNS).reset_index(drop=True)


# -- snapshots of window operators ------------------------------------------------------------

def snapshot_midway(backend: StateBackend, assigner, key, ts, x, half: int, *,
                    make: Callable[..., WindowOperator] = window_operator
                    ) -> tuple[dict[int, bytes], pd.DataFrame]:
    """Run the first ``half`` rows, snapshot (the synchronous part), process the rest
    before the asynchronous part runs, then finish: (sections, whole run's results).
    ``make(backend, assigner, index=, parallelism=)`` gives the operator."""
    whole = make(backend, assigner)
    whole.initialize_state(None)
    whole.open()
    whole.process_batch(pa.record_batch({"k": key[:half], "ts": ts[:half], "x": x[:half]}))
    whole.process_watermark(int(ts[:half].max()) - 100)
    snapshot = whole.snapshot_state(1).keyed_state
    assert snapshot is not None
    whole.process_batch(pa.record_batch({"k": key[half:], "ts": ts[half:], "x": x[half:]}))
    sections = snapshot()
    whole.process_watermark(rs.MAX_WATERMARK)
    return sections, pa.Table.from_batches(whole.output.batches).to_pandas()  # pyright: ignore


def restore_and_finish(backend: StateBackend, assigner, sections, key, ts, x, half: int,
                       parallelism: int, *,
                       make: Callable[..., WindowOperator] = window_operator) -> pd.DataFrame:
    """Restore ``sections`` into ``parallelism`` subtasks by key group, feed each the rest
    of its keys' rows, finish: the union of their results."""
    floors = WatermarkFloors.from_json(int(ts[:half].max()) - 100, max_parallelism=MAXP)
    out = []
    for index in range(parallelism):
        op = make(backend, assigner, index=index, parallelism=parallelism)
        groups = rs.key_group_range(index, parallelism, MAXP)
        op.initialize_state(RestoredState(1, [], [(g, s) for g, s in sections.items()
                                                   if g in groups], floors))
        op.open()
        assert backend is StateBackend.HEAP or not getattr(op.store, "entries", None)  # on disk: none on the heap
        mine = np.array([rs.key_group_of(k, MAXP) in groups for k in key[half:].tolist()])
        op.process_batch(pa.record_batch({"k": key[half:][mine], "ts": ts[half:][mine],
                                          "x": x[half:][mine]}))
        op.process_watermark(rs.MAX_WATERMARK)
        out.extend(op.output.batches)  # pyright: ignore
    return pa.Table.from_batches(out).to_pandas()


def check_restores_at_other_parallelism(assigner, key, ts, x, half: int, *,
                                        normal: Callable[[pd.DataFrame], pd.DataFrame],
                                        make: Callable[..., WindowOperator] = window_operator,
                                        backend: StateBackend = StateBackend.DISK,
                                        ) -> tuple[dict[int, bytes], pd.DataFrame]:
    """Snapshot a run on ``backend`` midway and restore it into 1, 2 and 3 subtasks of
    ``backend``: the windows open at the snapshot fire once, as in the uninterrupted run
    (rows compared after ``normal``). On disk, a heap run's snapshot restores into 2 disk
    subtasks too, and the disk sections into 1 and 3 heap subtasks. Returns the sections
    and the uninterrupted run's results (normalized) that were open at the snapshot."""
    sections, whole = snapshot_midway(backend, assigner, key, ts, x, half, make=make)
    open_at_snapshot = normal(whole[whole["window_end"] - 1 > int(ts[:half].max()) - 100])
    assert len(open_at_snapshot)
    for parallelism in (1, 2, 3):
        got = restore_and_finish(backend, assigner, sections, key, ts, x, half,
                                 parallelism, make=make)
        pd.testing.assert_frame_equal(normal(got), open_at_snapshot)
    if backend is StateBackend.HEAP:
        return sections, open_at_snapshot

    heap_sections, heap_whole = snapshot_midway(StateBackend.HEAP, assigner, key, ts, x, half,
                                                make=make)
    pd.testing.assert_frame_equal(normal(heap_whole), normal(whole))
    got = restore_and_finish(StateBackend.DISK, assigner, heap_sections, key, ts, x, half, 2,
                             make=make)
    pd.testing.assert_frame_equal(normal(got), open_at_snapshot)

    for parallelism in (1, 3):  # the disk sections move into heap subtasks
        got = restore_and_finish(StateBackend.HEAP, assigner, sections, key, ts, x, half,
                                 parallelism, make=make)
        pd.testing.assert_frame_equal(normal(got), open_at_snapshot)
    return sections, open_at_snapshot


# -- session windows --------------------------------------------------------------------------

GAP = 15
SESSIONS = rs.EventTimeSessionWindows(gap_ms=GAP)


def heap_and_disk_sessions(make: Callable[[StateBackend], WindowOperator], key, ts, x,
                           lateness: int
                           ) -> tuple[WindowOperator, pd.DataFrame, SessionRun, list[int]]:
    """Drive a heap and a disk session operator (``make(backend)``, over ``SESSIONS``)
    with the same rows: the same output (re-firings included, in the same order),
    arrivals and late rows, and no session left on disk; every emission and late row as
    the model makes them. Returns the disk operator, its output, the model's run and the
    watermark each row met."""
    heap, heap_arrival, heap_late = drive(make(StateBackend.HEAP), key, ts, x)
    op = make(StateBackend.DISK)
    disk, arrival, late = drive(op, key, ts, x)
    assert values_by_key(op) == {}  # every session fired and deleted
    pd.testing.assert_frame_equal(disk, heap)
    assert arrival == heap_arrival
    pd.testing.assert_frame_equal(late, heap_late)
    run = session_run(key, ts, x, arrival, 25, GAP, lateness)
    assert run.late, "the input must hold late rows"
    assert sorted(zip(late["k"].tolist(), late["ts"].tolist(), late["x"].tolist())) == sorted(
        run.late)
    return op, disk, run, arrival


# -- window joins -----------------------------------------------------------------------------

JOIN_TUMBLING = rs.TumblingEventTimeWindows(size_ms=100)
JOIN_SLIDING = rs.SlidingEventTimeWindows(size_ms=120, slide_ms=50)
JOIN_SESSION = rs.EventTimeSessionWindows(gap_ms=30)


def window_join_operator(backend: StateBackend, assigner, kind=WindowJoinKind.JOIN, fn=None,
                         *, index: int = 0, parallelism: int = 1) -> WindowJoinOperator:
    """A window join (or co-group) ``wjoin`` of key ``k``, time ``ts`` on both sides."""
    spec = WindowJoinSpec(kind, assigner, (KeySelector.of("k"), KeySelector.of("k")),
                          ("ts", "ts"))
    op = WindowJoinOperator("wjoin", spec, fn)
    op.setup(RuntimeContext("job", "wjoin", index, parallelism, MAXP, 0, state_backend=backend),
             CollectingOutput())
    return op


def feed_sides(op, frame: pd.DataFrame, *, batch: int = 23, lag: int = 40,
               columns=("id", "k", "ts"), right_columns=None) -> pd.DataFrame:
    """Feed a two-input operator rows in order, each batch to its side (column ``side``;
    ``columns`` of the left rows, ``right_columns`` of the right); after each batch the
    watermark is max(ts seen) - lag - 1. Returns the rows fed, with the watermark on
    their arrival (column ``wm``) and their ``process_batch`` call (column ``call``)."""
    fed, watermark, max_ts = [], rs.MIN_WATERMARK, rs.MIN_WATERMARK
    for start in range(0, len(frame), batch):
        chunk = frame.iloc[start:start + batch]
        for side in (0, 1):
            part = chunk[chunk["side"] == side]
            if len(part):
                fed.append(part.assign(wm=watermark, call=len(fed)))
                names = list(columns if side == 0 else right_columns or columns)
                op.process_batch(pa.RecordBatch.from_pandas(part[names], preserve_index=False),
                                 side)
        max_ts = max(max_ts, int(chunk["ts"].max()))
        watermark = max(watermark, max_ts - lag - 1)
        op.process_watermark(watermark)
    return pd.concat(fed)


def drive_join(op, frame: pd.DataFrame, assigner, *, batch: int = 23, lag: int = 40,
               columns=("id", "k", "ts"), right_columns=None
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`feed_sides` a window join, then MAX_WATERMARK at the end. Returns the
    rows that were on time on arrival, with the watermark then (column ``wm``), and the
    rows late for all their windows, as the operator must judge them (sessions: by the
    model, a row whose own window is late is kept when it meets an open session; the
    rows on time have column ``call``, their ``process_batch`` call, too)."""
    rows = feed_sides(op, frame, batch=batch, lag=lag, columns=columns,
                      right_columns=right_columns)
    op.process_watermark(rs.MAX_WATERMARK)
    if isinstance(assigner, rs.EventTimeSessionWindows):
        dropped = fed_sessions(rows, assigner.gap_ms)["window_start"].isna()
    else:
        dropped = is_late(rows["ts"], assigner, rows["wm"])
    return rows[~dropped], rows[dropped].drop(columns=["wm", "call"])


def output_of(op) -> pa.Table:
    """The operator's output batches as one table."""
    return pa.Table.from_batches(op.output.batches)


def window_pairs_of(table: pa.Table) -> list:
    """(left id, right id, window start, window end) per row of a window join's output."""
    return list(zip(table["id"].to_pylist(), table["id_right"].to_pylist(),
                    table["window_start"].to_pylist(), table["window_end"].to_pylist()))


def window_rows(op: WindowJoinOperator, kind: WindowJoinKind) -> list:
    """A join's pairs (:func:`window_pairs_of`), or a co-group's rows of
    :func:`tests.support.functions.co_groups`, sorted."""
    if kind is WindowJoinKind.JOIN:
        return sorted(window_pairs_of(output_of(op)))
    rows = [r for b in op.output.batches for r in b.to_pylist()]  # pyright: ignore[reportAttributeAccessIssue]
    return sorted((r["k"], r["window_start"], r["window_end"], tuple(r["left"]),
                   tuple(r["right"])) for r in rows)


# -- interval joins ---------------------------------------------------------------------------

def pairs_of(table: pa.Table | list) -> list:
    """(left id, right id) per output row (a table, or an operator's output batches)."""
    if isinstance(table, list):
        if not table:
            return []
        table = pa.Table.from_batches(table)
    return list(zip(table["id"].to_pylist(), table["id_right"].to_pylist()))
