"""Built-in window aggregates, computed on whole Arrow batches.

Every aggregate is kept as *partials* — mergeable columns (a count, a sum, a
minimum with its count of non-null values, ...). A batch becomes partials per
(key, window) with one pyarrow ``group_by``; partials from several batches (or
from upstream pre-aggregation) merge with ``sum``/``min``/``max``. Nulls are
skipped, as in SQL; ``min``/``max``/``mean`` of no non-null value is null and
``sum`` of none is 0.

    >>> import pyarrow as pa
    >>> spec = AggregateSpec.of({"n": ("count", None), "top": ("max", "x")})
    >>> table = pa.table({"g": [0, 0, 1], "x": [5, 7, None]})
    >>> partials = spec.partials_of_rows(table, ["g"])
    >>> results = spec.results({c: partials[c].to_numpy() for c in spec.partial_columns})
    >>> {name: column.to_pylist() for name, column in results.items()}
    {'n': [2, 1], 'top': [7, None]}
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

KINDS = ("count", "sum", "min", "max", "mean")

# partial column -> how partials merge ("sum" | "min" | "max")
_PARTIALS = {
    "count": (("n", "sum"),),
    "sum": (("sum", "sum"),),
    "min": (("min", "min"), ("nn", "sum")),
    "max": (("max", "max"), ("nn", "sum")),
    "mean": (("sum", "sum"), ("nn", "sum")),
}


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``kind`` of ``column`` (``column`` is None for count)."""

    output: str
    kind: str
    column: str | None

    def partial_names(self) -> list[tuple[str, str]]:
        return [(f"__{self.output}.{part}", merge) for part, merge in _PARTIALS[self.kind]]


@dataclass(frozen=True)
class AggregateSpec:
    """The built-in aggregates of one window operator, in output order."""

    aggregates: tuple[Aggregate, ...]

    @classmethod
    def of(cls, named: dict[str, tuple[str, str | None]]) -> "AggregateSpec":
        aggregates = []
        for output, (kind, column) in named.items():
            if kind not in KINDS:
                raise ValueError(f"unknown window aggregate {kind!r} for '{output}'; "
                                 f"built-ins: {', '.join(KINDS)} (or pass an AggregateFunction)")
            if kind != "count" and not column:
                raise ValueError(f"window aggregate '{output}' ({kind}) needs a column")
            aggregates.append(Aggregate(output, kind, None if kind == "count" else column))
        if not aggregates:
            raise ValueError("no window aggregate given")
        return cls(tuple(aggregates))

    @property
    def partial_columns(self) -> list[str]:
        return [name for a in self.aggregates for name, _ in a.partial_names()]

    @property
    def merges(self) -> dict[str, str]:
        return {name: merge for a in self.aggregates for name, merge in a.partial_names()}

    @property
    def input_columns(self) -> list[str]:
        return sorted({a.column for a in self.aggregates if a.column})

    def check_input(self, schema: pa.Schema, where: str) -> None:
        for a in self.aggregates:
            if a.column is None:
                continue
            index = schema.get_field_index(a.column)
            if index < 0:
                raise ValueError(f"{where}: aggregate '{a.output}' needs column '{a.column}' "
                                 f"(columns: {', '.join(schema.names)})")
            kind = schema.field(index).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise TypeError(f"{where}: built-in aggregate {a.kind}('{a.column}') needs a numeric "
                                f"column, '{a.column}' is {kind}; use aggregate(AggregateFunction)")

    def partials_of_rows(self, table: pa.Table, by: list[str]) -> pa.Table:
        """Group raw rows by the ``by`` columns: one row of partials per group."""
        calls, names = [], []
        for a in self.aggregates:
            for name, _ in a.partial_names():
                part = name.rsplit(".", 1)[1]
                if part == "n":
                    calls.append(([], "count_all"))
                elif part == "nn":
                    calls.append((a.column, "count"))
                elif a.kind == "mean":
                    calls.append((f"__float.{a.column}", "sum"))
                else:
                    calls.append((a.column, part))
                names.append(name)
        for column in {a.column for a in self.aggregates if a.kind == "mean"}:
            table = table.append_column(f"__float.{column}", pc.cast(table[column], pa.float64()))
        grouped = table.group_by(by, use_threads=False).aggregate(calls)
        return _rename_partials(grouped, by, names, self)

    def merge_partials(self, table: pa.Table, by: list[str]) -> pa.Table:
        """Merge partial rows with equal ``by`` columns (from several batches or subtasks)."""
        merges = self.merges
        calls = [(name, merges[name]) for name in self.partial_columns]
        grouped = table.group_by(by, use_threads=False).aggregate(calls)
        return _rename_partials(grouped, by, self.partial_columns, self)

    # -- dense accumulators: numpy arrays indexed by key id -------------------------
    def identity(self, name: str, dtype: np.dtype) -> object:
        return _identity(self.merges[name], dtype)

    def merge_into(self, name: str, target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
        """``target[index] = merge(target[index], values)``; ``index`` has no duplicates."""
        merge = self.merges[name]
        if merge == "sum":
            target[index] += values
        elif merge == "min":
            target[index] = np.minimum(target[index], values)
        else:
            target[index] = np.maximum(target[index], values)

    def results(self, partials: dict[str, np.ndarray]) -> dict[str, pa.Array]:
        """Output columns from merged partials (arrays aligned row by row)."""
        out = {}
        for a in self.aggregates:
            names = [name for name, _ in a.partial_names()]
            if a.kind == "count":
                out[a.output] = pa.array(partials[names[0]].astype(np.int64))
            elif a.kind == "sum":
                out[a.output] = pa.array(partials[names[0]])
            elif a.kind in ("min", "max"):
                values, seen = partials[names[0]], partials[names[1]]
                out[a.output] = pa.array(values, mask=seen == 0)
            else:
                total, seen = partials[names[0]], partials[names[1]]
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[a.output] = pa.array(total / np.maximum(seen, 1), mask=seen == 0)
        return out


def _rename_partials(grouped: pa.Table, by: list[str], names: list[str],
                     spec: AggregateSpec) -> pa.Table:
    """``group_by().aggregate()`` names outputs ``<column>_<function>``, in call order
    after... or before the keys depending on the pyarrow version: select them by
    position among the non-key columns, then name them."""
    rest = [i for i, n in enumerate(grouped.column_names) if n not in by]
    columns = {n: grouped.column(n) for n in by}
    merges = spec.merges
    for name, i in zip(names, rest):
        column = grouped.column(i)
        if column.null_count:  # e.g. the min of no non-null value: the merge's identity
            identity = _identity(merges[name], column.type.to_pandas_dtype())
            column = pc.fill_null(column, pa.scalar(identity, column.type))
        columns[name] = column
    return pa.table(columns)


def _identity(merge: str, dtype) -> object:
    """The value that leaves any other unchanged under ``merge``."""
    if merge == "sum":
        return 0
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    if merge == "min":
        return info.max if info else np.inf
    return info.min if info else -np.inf
