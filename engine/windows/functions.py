"""What a window computes: built-in aggregates, a user ``AggregateFunction``, or a
full-window ``ProcessWindowFunction``.

Each is a :class:`WindowFunction` with one accumulator per (key, window): how
a batch's rows of one window become an accumulator, how two accumulators
merge (session windows merge), and how an accumulator becomes output rows.
Built-in aggregates normally take the vectorized path of the window operator
(dense arrays per window); this per-accumulator form serves session windows.

    >>> class Average:  # an AggregateFunction: create/add/merge/get_result
    ...     def create_accumulator(self): return (0, 0)
    ...     def add(self, row, acc): return (acc[0] + row["x"], acc[1] + 1)
    ...     def merge(self, a, b): return (a[0] + b[0], a[1] + b[1])
    ...     def get_result(self, acc): return acc[0] / acc[1]
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from raystream.checkpoint.state import AggregateFunction
from raystream.engine.batches import capture_row
from raystream.engine.errors import describe_record
from raystream.engine.windows.aggregates import AggregateSpec


@dataclass(frozen=True)
class Window:
    """A window ``[start, end)`` in ms since the epoch."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        return self.end - 1


class ProcessWindowFunction:
    """Sees all rows of one key's window at once, when the window fires.

        >>> import pyarrow.compute as pc
        >>> class Spread(ProcessWindowFunction):
        ...     def process(self, key, window, rows):
        ...         yield {"user": key, "start": window.start,
        ...                "spread": pc.max(rows["x"]).as_py() - pc.min(rows["x"]).as_py()}
    """

    def open(self, ctx: Any) -> None:
        """Called once per subtask before the first window."""

    def process(self, key: Any, window: Window, rows: pa.Table) -> Iterable[dict] | None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class WindowFunction:
    """Accumulators per (key, window) for the generic (per-accumulator) path."""

    rows_output = True  # results are dict rows (False: columns from ``results``)

    def accumulate(self, rows: pa.Table, offsets: np.ndarray) -> list[Any]:
        """One accumulator per group: rows ``offsets[i]:offsets[i+1]`` of ``rows``."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def frozen(self, accumulator: Any) -> Any:
        """A value a snapshot may keep while processing continues (no later mutation)."""
        return accumulator

    def thawed(self, frozen: Any) -> Any:
        return frozen

    def rows(self, key: Any, window: Window, accumulator: Any) -> list[dict]:
        """A fired window's result rows (when ``rows_output``); ``key`` is the key (for
        :class:`UserAggregate`, the key's fields)."""
        raise NotImplementedError


class BuiltinAggregates(WindowFunction):
    """Built-in aggregates (count, sum, min, max, mean, max_by, top_k); accumulators are
    dicts of partials."""

    rows_output = False

    def __init__(self, spec: AggregateSpec) -> None:
        self.spec = spec

    def accumulate(self, rows, offsets):
        groups = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        partials = self.spec.partials_of_rows(rows.append_column("__group", pa.array(groups)),
                                              ["__group"])
        order = np.argsort(partials["__group"].to_numpy())
        columns = {name: partials[name].to_numpy()[order].tolist()
                   for name in self.spec.partial_columns}
        return [{name: values[i] for name, values in columns.items()}
                for i in range(len(offsets) - 1)]

    def merge(self, a, b):
        # a new dict: accumulators are never mutated, so snapshots may share them
        return self.spec.merge_dicts(a, b)

    def results(self, accumulators: list[dict]) -> dict[str, pa.Array]:
        return self.spec.results({name: np.array([acc[name] for acc in accumulators])
                                  for name in self.spec.partial_columns})


class UserAggregate(WindowFunction):
    """A user :class:`~raystream.checkpoint.state.AggregateFunction`; ``get_result``
    returns a dict (its fields become columns) or a value (column ``output``)."""

    def __init__(self, fn: AggregateFunction, output: str) -> None:
        self.fn = fn
        self.output = output

    def accumulate(self, rows, offsets):
        fn, out, records = self.fn, [], rows.to_pylist()
        for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            acc = fn.create_accumulator()
            for record in records[lo:hi]:
                try:
                    acc = fn.add(record, acc)
                except Exception as exc:
                    exc.add_note(f"record: {describe_record(record)}")
                    raise
            out.append(acc)
        return out

    def merge(self, a, b):
        return self.fn.merge(a, b)

    def frozen(self, accumulator):
        return pickle.dumps(accumulator, protocol=5)  # add() may mutate it in place later

    def thawed(self, frozen):
        return pickle.loads(frozen)

    def rows(self, key_fields: dict, window: Window, accumulator: Any) -> list[dict]:
        result = self.fn.get_result(accumulator)
        fields = dict(result) if isinstance(result, dict) else {self.output: result}
        return [{**key_fields, "window_start": window.start, "window_end": window.end, **fields}]


class ProcessWindow(WindowFunction):
    """A :class:`ProcessWindowFunction`; accumulators are the window's row batches."""

    def __init__(self, fn: ProcessWindowFunction) -> None:
        self.fn = fn

    def accumulate(self, rows, offsets):
        return [tuple(rows.slice(lo, hi - lo).to_batches())
                for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist())]

    def merge(self, a, b):
        return a + b  # tuples of immutable batches: snapshots may share them

    def rows(self, key: Any, window: Window, accumulator: tuple) -> list[dict]:
        batches = [b for b in accumulator if b.num_rows]
        table = pa.Table.from_batches(batches) if batches else pa.table({})
        return list(map(capture_row, self.fn.process(key, window, table) or ()))
