"""Key tables of disk jobs stay bounded: session windows of user functions, count
windows, window joins and co-groups, interval joins, keyed reduce.

Each operator kind runs on the disk backend with a key table of ``LIMIT`` keys and
many times more keys than that (keys drift with time, so a key's rows are close in
time and its sessions merge), with disorder below the watermark's lag and stragglers
far behind it. Half-way the subtask is snapshotted and restored into two subtasks
(by key group). The disk job's output is the heap job's (same schedule) and an
independent pandas oracle's; the timer service's key table never holds more than
``LIMIT`` keys plus those of one batch or firing, and is emptied again and again.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs
from raystream.actors.operator import CollectingOutput, RestoredState, RuntimeContext
from raystream.checkpoint.state_backend import StateBackend
from raystream.checkpoint.watermark_floors import WatermarkFloors
from raystream.engine.keys import KeySelector
from raystream.engine.operators.interval_join import (IntervalBounds, IntervalJoinOperator,
                                                      IntervalJoinSpec)
from raystream.engine.operators.keyed import ReduceOperator, KeyedOperator
from raystream.engine.windows.aggregates import AggregateSpec
from raystream.engine.windows.count import CountWindowOperator
from raystream.engine.windows.join import WindowJoinKind, WindowJoinOperator, WindowJoinSpec
from raystream.engine.windows.operator import WindowOperator
from tests.chaos.model import session_run
from tests.support.functions import co_groups
from tests.support.inputs import BASE
from tests.support.operators import (JOIN_SLIDING, JOIN_TUMBLING, function_of, normalized,
                                     window_pairs_of)
from tests.support.oracles import (fed_sessions, interval_oracle, is_late, oracle_groups,
                                   oracle_pairs)

MAXP = 128
LIMIT = 16  # the key table's limit in these tests
BATCH = 12  # rows per step (both sides together)
LAG = 40  # the watermark: max(ts seen) - LAG - 1 after every step
PARALLELISM_AFTER = 2  # the subtasks restored from the snapshot taken half-way
# a batch's keys, or a firing's (the keys of what one step of the watermark closes)
BOUND = LIMIT + 2 * BATCH

Make = Callable[[StateBackend, int, int], KeyedOperator]


def make_events(seed: int, n: int, *, sides: int) -> pd.DataFrame:
    """Rows about 4 ms apart, disordered by up to 29 ms (below the lag), every 53rd
    after the first 200 two seconds late (beyond the lag); keys drift: about 15 keys
    active at a time, 10 new ones every 50 rows."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    ts = BASE + i * 4 + rng.integers(0, 30, n)
    ts[(i % 53 == 52) & (i > 200)] -= 2000
    return pd.DataFrame({"id": i, "k": i // 50 * 10 + rng.integers(0, 15, n), "ts": ts,
                         "side": rng.integers(0, sides, n),
                         "x": rng.integers(-50, 50, n).astype(np.float64)})


def setup(op: KeyedOperator, index: int, parallelism: int, backend: StateBackend
          ) -> KeyedOperator:
    op.setup(RuntimeContext("job", op.name, index, parallelism, MAXP, 0,
                            state_backend=backend), CollectingOutput())
    return op


class Run:
    """One job by hand: subtasks by key group, the same batches and watermarks whatever
    the backend and parallelism; records each row's watermark on arrival and the key
    table's size after every call."""

    def __init__(self, make: Make, backend: StateBackend, columns: list[str]) -> None:
        self.make, self.backend, self.columns = make, backend, columns
        self.watermark, self.seen = rs.MIN_WATERMARK, rs.MIN_WATERMARK
        self.arrival: list[int] = []
        self.sizes: list[int] = []
        self.emptied = 0  # key tables emptied (all subtasks)
        self.batches: list[pa.RecordBatch] = []
        self.ops: list[tuple[KeyedOperator, range]] = []

    def start(self, parallelism: int, sections: dict[int, bytes] | None = None) -> None:
        floors = (None if sections is None
                  else WatermarkFloors.from_json(self.watermark, max_parallelism=MAXP))
        self.ops = []
        for index in range(parallelism):
            groups = rs.key_group_range(index, parallelism, MAXP)
            op = self.make(self.backend, index, parallelism)
            op.initialize_state(None if sections is None else RestoredState(
                1, [], [(g, s) for g, s in sections.items() if g in groups], floors))
            op.open()
            if self.backend is StateBackend.DISK:
                op.disk_timers.key_table_limit = LIMIT
            self.ops.append((op, groups))

    def _measure(self, op: KeyedOperator) -> None:
        if self.backend is StateBackend.DISK:
            self.sizes.append(op.disk_timers.num_keys)

    def feed(self, frame: pd.DataFrame) -> None:
        groups = np.array([rs.key_group_of(k, MAXP) for k in frame["k"].tolist()])
        for a in range(0, len(frame), BATCH):
            part, part_groups = frame.iloc[a:a + BATCH], groups[a:a + BATCH]
            for op, mine in self.ops:
                rows = part[(part_groups >= mine.start) & (part_groups < mine.stop)]
                for side in sorted(set(rows["side"].tolist())):
                    sided = rows[rows["side"] == side]
                    op.process_batch(pa.RecordBatch.from_pandas(
                        sided[self.columns], preserve_index=False), side)
                    self._measure(op)
            self.arrival += [self.watermark] * len(part)
            self.seen = max(self.seen, int(part["ts"].max()))
            self.watermark = max(self.watermark, self.seen - LAG - 1)
            self.advance(self.watermark)

    def advance(self, watermark: int) -> None:
        for op, _ in self.ops:
            op.process_watermark(watermark)
            self._measure(op)

    def stop(self) -> dict[int, bytes]:
        """Collect the subtasks' output; their snapshot sections."""
        sections: dict[int, bytes] = {}
        for op, _ in self.ops:
            output = op.output
            assert isinstance(output, CollectingOutput)
            self.batches += [b for b in output.batches if b.num_rows]
            if self.backend is StateBackend.DISK:
                self.emptied += op.disk_timers.generation
            snapshot = op.snapshot_state(1).keyed_state
            assert snapshot is not None
            sections.update(snapshot())
        return sections


def run_job(make: Make, backend: StateBackend, frame: pd.DataFrame, columns: list[str]) -> Run:
    """The first half at parallelism 1, a snapshot, the rest at PARALLELISM_AFTER."""
    run = Run(make, backend, columns)
    half = len(frame) // 2
    run.start(1)
    run.feed(frame.iloc[:half])
    sections = run.stop()
    run.start(PARALLELISM_AFTER, sections)
    run.feed(frame.iloc[half:])
    run.advance(rs.MAX_WATERMARK)
    run.stop()
    return run


def both(make: Make, frame: pd.DataFrame, columns: list[str]) -> tuple[Run, Run]:
    """(heap run, disk run); the disk one's key tables stayed within their bound."""
    heap, disk = (run_job(make, backend, frame, columns)
                  for backend in (StateBackend.HEAP, StateBackend.DISK))
    assert heap.arrival == disk.arrival
    keys = frame["k"].nunique()
    assert keys > 15 * LIMIT
    assert disk.sizes and max(disk.sizes) <= BOUND, max(disk.sizes)
    return heap, disk


def table_of(run: Run) -> pa.Table:
    return pa.Table.from_batches(run.batches)


# -- session windows of user functions ---------------------------------------------------------

GAP = 40


def sessions_oracle(frame: pd.DataFrame, arrival: list[int], kind: str) -> pd.DataFrame:
    """The model's sessions of each key (tests/chaos/model.py: a row whose own window
    ``[ts, ts + GAP)`` ended by the watermark on its arrival counts only in an open
    session its window meets), fed in the batches of :class:`Run`."""
    run = session_run(frame["k"], frame["ts"], frame["x"], arrival, BATCH, GAP, 0)
    return normalized(pd.DataFrame(
        [{"k": k, "window_start": start, "window_end": end, "rows": len(x),
          "value": sum(x) / len(x) if kind == "aggregate" else max(x) - min(x)}
         for k, start, end, x in run.emissions]))


@pytest.mark.parametrize("kind", ["aggregate", "process"])
def test_sessions_of_user_functions(kind):
    def make(backend: StateBackend, index: int, parallelism: int) -> KeyedOperator:
        return setup(WindowOperator("w", KeySelector.of("k"), rs.EventTimeSessionWindows(GAP),
                                    function=function_of(kind), timestamp="ts",
                                    late_output="late"), index, parallelism, backend)

    frame = make_events(1, 1600, sides=1)
    heap, disk = both(make, frame, ["k", "ts", "x"])
    assert disk.emptied > 10
    got = normalized(table_of(disk).to_pandas())
    pd.testing.assert_frame_equal(got, normalized(table_of(heap).to_pandas()))
    pd.testing.assert_frame_equal(got, sessions_oracle(frame, disk.arrival, kind))
    assert (got["rows"] > 1).any()  # sessions merged


# -- count windows ---------------------------------------------------------------------------

def count_oracle(frame: pd.DataFrame, size: int, slide: int) -> list[tuple]:
    out = []
    for key, group in frame.groupby("k", sort=False):
        xs = group["x"].tolist()
        for p in range(slide - 1, len(xs), slide):
            window = xs[max(0, p - size + 1):p + 1]
            out.append((key, len(window), sum(window)))
    return sorted(out)


@pytest.mark.parametrize(("size", "slide"), [(4, None), (3, 2)])
def test_count_windows(size, slide):
    """Count windows on disk name keys by their encoded bytes only: the key table
    stays empty."""
    def make(backend: StateBackend, index: int, parallelism: int) -> KeyedOperator:
        return setup(CountWindowOperator(
            "c", KeySelector.of("k"), size=size, slide=slide,
            spec=AggregateSpec.of({"n": ("count", None), "total": ("sum", "x")})),
            index, parallelism, backend)

    frame = make_events(2, 1600, sides=1)
    heap, disk = both(make, frame, ["k", "x"])
    assert max(disk.sizes) == 0

    def rows(run: Run) -> list[tuple]:
        return sorted((r["k"], r["n"], r["total"]) for r in table_of(run).to_pylist())

    assert rows(disk) == rows(heap) == count_oracle(frame, size, slide or size)
    assert rows(disk)


# -- window joins and co-groups ----------------------------------------------------------------

SESSIONS = rs.EventTimeSessionWindows(gap_ms=GAP)


def window_results(run: Run, kind: WindowJoinKind) -> list:
    if kind is WindowJoinKind.JOIN:
        return sorted(window_pairs_of(table_of(run)))
    return sorted((r["k"], r["window_start"], r["window_end"], tuple(r["left"]),
                   tuple(r["right"])) for b in run.batches for r in b.to_pylist())


@pytest.mark.parametrize("kind", list(WindowJoinKind), ids=lambda k: k.value)
@pytest.mark.parametrize("assigner", [JOIN_TUMBLING, JOIN_SLIDING, SESSIONS],
                         ids=["tumbling", "sliding", "session"])
def test_window_joins(assigner, kind):
    fn = co_groups if kind is WindowJoinKind.CO_GROUP else None

    def make(backend: StateBackend, index: int, parallelism: int) -> KeyedOperator:
        spec = WindowJoinSpec(kind, assigner, (KeySelector.of("k"), KeySelector.of("k")),
                              ("ts", "ts"))
        return setup(WindowJoinOperator("wjoin", spec, fn), index, parallelism, backend)

    frame = make_events(3, 1600, sides=2)
    heap, disk = both(make, frame, ["id", "k", "ts"])
    assert disk.emptied > 10
    # each row's call: its batch's and side's (a key's rows of one side in a batch: one call)
    fed = frame.assign(wm=disk.arrival, call=np.arange(len(frame)) // BATCH * 2 + frame["side"])
    dropped = (fed_sessions(fed, assigner.gap_ms)["window_start"].isna()
               if isinstance(assigner, rs.EventTimeSessionWindows)
               else is_late(fed["ts"], assigner, fed["wm"]))
    on_time = fed[~dropped]
    assert len(on_time) < len(frame)
    left, right = (on_time[on_time["side"] == side] for side in (0, 1))
    expected = sorted(oracle_pairs(left, right, assigner) if kind is WindowJoinKind.JOIN
                      else oracle_groups(left, right, assigner))
    assert window_results(disk, kind) == window_results(heap, kind) == expected and expected


# -- interval joins ------------------------------------------------------------------------------

def test_interval_join():
    bounds = IntervalBounds(-30, 20)

    def make(backend: StateBackend, index: int, parallelism: int) -> KeyedOperator:
        spec = IntervalJoinSpec(bounds, (KeySelector.of("k"), KeySelector.of("k")),
                                ("ts", "ts"))
        return setup(IntervalJoinOperator("join", spec), index, parallelism, backend)

    frame = make_events(4, 1600, sides=2)
    heap, disk = both(make, frame, ["id", "k", "ts"])
    assert disk.emptied > 10
    on_time = frame[frame["ts"].to_numpy() >= np.array(disk.arrival)]
    assert len(on_time) < len(frame)
    left, right = (on_time[on_time["side"] == side] for side in (0, 1))
    expected = sorted(interval_oracle(left, right, bounds.lower, bounds.upper))

    def pairs(run: Run) -> list:
        table = table_of(run)
        return sorted(zip(table["id"].to_pylist(), table["id_right"].to_pylist()))

    assert pairs(disk) == pairs(heap) == expected and expected


# -- keyed reduce ----------------------------------------------------------------------------------

def test_reduce():
    """A keyed reduce on disk names keys by their encoded bytes only: the key table stays
    empty."""
    def make(backend: StateBackend, index: int, parallelism: int) -> KeyedOperator:
        return setup(ReduceOperator("r", lambda acc, row: {**row, "x": acc["x"] + row["x"]},
                                    KeySelector.of("k")), index, parallelism, backend)

    frame = make_events(5, 1600, sides=1)
    heap, disk = both(make, frame, ["id", "k", "x"])
    assert max(disk.sizes) == 0

    def rows(run: Run) -> list[tuple]:
        return sorted((r["id"], r["k"], r["x"]) for r in table_of(run).to_pylist())

    expected = sorted(zip(frame["id"].tolist(), frame["k"].tolist(),
                          frame.groupby("k")["x"].cumsum().tolist()))
    assert rows(disk) == rows(heap) == expected
