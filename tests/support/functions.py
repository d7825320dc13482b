"""User functions the tests run, each with what a test relies on said in its docstring:
window aggregates and process functions, state aggregates, join and co-group
functions, the exactly-once job's running sum, and an operator that watches watermarks."""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

import raystream as rs
from raystream.checkpoint.disk_handles import DiskValueState
from raystream.checkpoint.state import ValueState

# -- windows ----------------------------------------------------------------------------------

# built-in aggregates of ``x``, as ``window(...).agg(**AGGS)`` and ``AggregateSpec.of`` take them
AGGS = {"n": ("count", None), "total": ("sum", "x"), "low": ("min", "x"), "high": ("max", "x"),
        "avg": ("mean", "x")}


class Average:
    """A window AggregateFunction of ``x``: ``{"avg", "rows"}``."""

    def create_accumulator(self) -> list:
        return [0.0, 0]

    # mutates in place: snapshots must not see later changes
    def add(self, row: dict, acc: list) -> list:
        acc[0] += row["x"]
        acc[1] += 1
        return acc

    def merge(self, a: list, b: list) -> list:
        return [a[0] + b[0], a[1] + b[1]]

    def get_result(self, acc: list) -> dict:
        return {"avg": acc[0] / acc[1], "rows": acc[1]}


class Spread(rs.ProcessWindowFunction):
    """A window's max ``x`` minus its min, and its row count."""

    def process(self, key, window, rows: pa.Table) -> Iterator[dict]:
        xs = rows["x"].to_numpy()
        yield {"k": key, "window_start": window.start, "window_end": window.end,
               "spread": float(xs.max() - xs.min()), "rows": len(xs)}


class RowIds(rs.ProcessWindowFunction):
    """A window's row ids (column ``x``) in the order the function sees them."""

    def process(self, key, window, rows: pa.Table) -> Iterator[dict]:
        yield {"k": key, "window_start": window.start, "window_end": window.end,
               "ids": ",".join(str(int(i)) for i in rows["x"].to_pylist())}


# -- keyed state ------------------------------------------------------------------------------

class Avg:
    """AggregateFunction with a mutable accumulator that add/merge mutate in place."""

    def create_accumulator(self) -> list:
        return [0, 0]

    def add(self, value, acc: list) -> list:
        acc[0] += value
        acc[1] += 1
        return acc

    def get_result(self, acc: list) -> tuple:
        return (acc[0], acc[1])

    def merge(self, a: list, b: list) -> list:
        a[0] += b[0]
        a[1] += b[1]
        return a


# -- joins ------------------------------------------------------------------------------------

class Ids(rs.ProcessJoinFunction):
    """The ids of a pair, checked against the pair's timestamps and key."""

    def process_element(self, left: dict, right: dict, ctx) -> Iterator[dict]:
        assert (ctx.left_timestamp, ctx.right_timestamp) == (left["ts"], right["ts"])
        assert ctx.current_key == left["k"] == right["k"]
        yield {"id": left["id"], "id_right": right["id"]}


def co_groups(key, left: pa.Table, right: pa.Table, window) -> Iterator[dict]:
    """A co-group function: each side's sorted ids."""
    yield {"k": key, "left": tuple(sorted(left["id"].to_pylist())),
           "right": tuple(sorted(right["id"].to_pylist()))}


# -- the exactly-once job's running sum (tests.support.inputs.numbers) -------------------------

def add(acc: dict, row: dict) -> dict:
    """The reduce function: the sum of ``v``, the last row number, the count."""
    return {"k": row["k"], "v": acc["v"] + row["v"], "i": row["i"], "n": acc["n"] + 1}


class RunningSum(rs.KeyedProcessFunction):
    """:func:`add` as a keyed process function in a value state of ``backend`` (its
    value a dict: read, then replaced)."""

    def __init__(self, backend: str = "disk") -> None:
        self.backend = backend

    def open(self, ctx) -> None:
        self.acc = ctx.value_state("acc")
        kind = DiskValueState if self.backend == "disk" else ValueState
        assert isinstance(self.acc, kind), f"the job must run on the {self.backend} backend"

    def process_element(self, row: dict, ctx) -> Iterator[dict]:
        acc = self.acc.value()
        acc = dict(row) if acc is None else {"k": row["k"], "v": acc["v"] + row["v"],
                                            "i": row["i"], "n": acc["n"] + 1}
        self.acc.update(acc)
        yield acc


# -- operators --------------------------------------------------------------------------------

class WatermarkProbe(rs.Operator):
    """Counts records at or below the current watermark (late) and reports every watermark."""

    def open(self) -> None:
        self.watermark = rs.MIN_WATERMARK
        self.late = 0
        self.rows = 0

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        ts = batch.column("ts").to_numpy()
        self.late += int((ts <= self.watermark).sum())
        self.rows += len(ts)

    def process_watermark(self, watermark: int) -> None:
        if watermark <= self.watermark:
            raise AssertionError(f"watermark went from {self.watermark} to {watermark}")
        self.watermark = watermark
        self.output.emit(pa.record_batch({
            "subtask": [self.ctx.subtask_index], "watermark": [watermark],
            "late": [self.late], "rows": [self.rows]}))
