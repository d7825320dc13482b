"""Built-in window aggregates, computed on whole Arrow batches.

Every aggregate is kept as *partials* — mergeable columns (a count, a sum, a
minimum with its count of non-null values, ...). A batch becomes partials per
(key, window) with one pyarrow ``group_by``; partials from several batches (or
from upstream pre-aggregation) merge with ``sum``/``min``/``max``. Nulls are
skipped, as in SQL; ``min``/``max``/``mean`` of no non-null value is null and
``sum`` of none is 0.

Two aggregates pick values rather than fold them (vectorized with numpy over
the group ids of the same ``group_by``; no Python per record):

* ``("max_by", (value, by))``: ``value`` of the row with the largest ``by``
  (Flink/Spark ``max_by``). Rows where ``value`` or ``by`` is null are
  skipped. **Ties** on ``by`` go to the smallest ``value``, so the result does
  not depend on arrival order (replays and pre-aggregation give the same).
  Partials: the best ``by``, its ``value``, the count of rows considered.
* ``("top_k", (column, k))``: the ``k`` largest non-null values, largest
  first, as a list (shorter when fewer values; empty for none). Equal values
  are kept as often as they occur. Partials: ``k`` slots plus the count.

    >>> spec = AggregateSpec.of({"best": ("max_by", ("x", "y")), "top": ("top_k", ("x", 2))})
    >>> table = pa.table({"g": [0, 0, 0, 1], "x": [5, 7, 1, None], "y": [2.0, 2.0, 1.0, 9.0]})
    >>> partials = spec.partials_of_rows(table, ["g"])
    >>> results = spec.results({c: partials[c].to_numpy() for c in spec.partial_columns})
    >>> {name: column.to_pylist() for name, column in results.items()}
    {'best': [5, None], 'top': [[7, 5], []]}

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
from functools import cached_property
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
# its kernels' functions are made at import, so pyright sees none: ignored where used
import pyarrow.compute as pc

KINDS = ("count", "sum", "min", "max", "mean", "max_by", "top_k")
PICKING = ("max_by", "top_k")  # computed from group ids, not by a pyarrow hash aggregate
MAX_TOP_K = 1024

# partial column -> how partials merge ("sum" | "min" | "max")
_PARTIALS = {
    "count": (("n", "sum"),),
    "sum": (("sum", "sum"),),
    "min": (("min", "min"), ("nn", "sum")),
    "max": (("max", "max"), ("nn", "sum")),
    "mean": (("sum", "sum"), ("nn", "sum")),
    "max_by": (("by", "max"), ("val", "val"), ("nn", "sum")),  # "val": follows "by"
}


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``kind`` of ``column`` (``column`` is None for count)."""

    output: str
    kind: str
    column: str | None
    by: str | None = None  # max_by: the column whose largest value picks the row
    k: int = 0  # top_k: how many values

    def partial_names(self) -> list[tuple[str, str]]:
        if self.kind == "top_k":  # slots, largest first; a merge keeps the k largest
            return [*((f"__{self.output}.top{i}", "top") for i in range(self.k)),
                    (f"__{self.output}.nn", "sum")]
        return [(f"__{self.output}.{part}", merge) for part, merge in _PARTIALS[self.kind]]

    @property
    def columns(self) -> list[str]:
        return [c for c in (self.column, self.by) if c]


@dataclass(frozen=True)
class AggregateSpec:
    """The built-in aggregates of one window operator, in output order."""

    aggregates: tuple[Aggregate, ...]

    @classmethod
    def of(cls, named: dict[str, tuple[str, Any]]) -> "AggregateSpec":
        """``{output: (kind, column)}``; the column is None for count, ``(value, by)`` for
        max_by, ``(column, k)`` for top_k (checked here)."""
        aggregates = []
        for output, (kind, column) in named.items():
            if kind not in KINDS:
                raise ValueError(f"unknown window aggregate {kind!r} for '{output}'; "
                                 f"built-ins: {', '.join(KINDS)} (or pass an AggregateFunction)")
            if kind != "count" and not column:
                raise ValueError(f"window aggregate '{output}' ({kind}) needs a column")
            if kind == "max_by":
                if (not isinstance(column, (tuple, list)) or len(column) != 2
                        or not all(isinstance(c, str) for c in column)):
                    raise ValueError(f"window aggregate '{output}': max_by takes "
                                     f"(value_column, by_column), got {column!r}")
                aggregates.append(Aggregate(output, kind, column[0], by=column[1]))
                continue
            if kind == "top_k":
                if (not isinstance(column, (tuple, list)) or len(column) != 2
                        or not isinstance(column[0], str) or not isinstance(column[1], int)
                        or not 0 < column[1] <= MAX_TOP_K):
                    raise ValueError(f"window aggregate '{output}': top_k takes (column, k) "
                                     f"with 0 < k <= {MAX_TOP_K}, got {column!r}")
                aggregates.append(Aggregate(output, kind, column[0], k=column[1]))
                continue
            aggregates.append(Aggregate(output, kind, None if kind == "count" else column))
        if not aggregates:
            raise ValueError("no window aggregate given")
        return cls(tuple(aggregates))

    @property
    def partial_columns(self) -> list[str]:
        return [name for a in self.aggregates for name, _ in a.partial_names()]

    @cached_property
    def merges(self) -> dict[str, str]:
        return {name: merge for a in self.aggregates for name, merge in a.partial_names()}

    @property
    def input_columns(self) -> list[str]:
        return sorted({c for a in self.aggregates for c in a.columns})

    @cached_property
    def picking(self) -> list[Aggregate]:
        return [a for a in self.aggregates if a.kind in PICKING]

    def check_outputs(self, taken: Iterable[str], where: str) -> None:
        """Fail when an aggregate's output column would have the name of a column the
        operator emits anyway (a key column, ``window_start``, ``window_end``)."""
        clash = sorted({a.output for a in self.aggregates} & set(taken))
        if clash:
            raise ValueError(f"{where}: aggregate output '{clash[0]}' is also the name of a "
                             f"key or window column; name it, e.g. "
                             f"output='{clash[0]}_value' or agg({clash[0]}_value=(...))")

    def check_input(self, schema: pa.Schema, where: str, *, any_min_max: bool = False) -> None:
        """Fail naming the operator when a column an aggregate reads is missing or cannot
        be aggregated: numbers (integers, floating point, booleans, decimals) only, except
        for ``min``/``max`` where the operator keeps raw rows (``any_min_max``: count
        windows order any Arrow type). Raw rows only: pre-aggregated partials have other
        columns."""
        for a in self.aggregates:
            for column in a.columns:
                index = schema.get_field_index(column)
                if index < 0:
                    raise ValueError(f"{where}: aggregate '{a.output}' needs column '{column}' "
                                     f"(columns: {', '.join(schema.names)})")
                kind = schema.field(index).type
                if any_min_max and a.kind in ("min", "max") or _numeric(kind):
                    continue
                raise TypeError(f"{where}: built-in aggregate {a.kind}('{column}') needs a "
                                f"numeric column, '{column}' is {kind}; use "
                                f"aggregate(AggregateFunction)")

    def partials_of_rows(self, table: pa.Table, by: list[str]) -> pa.Table:
        """Group raw rows by the ``by`` columns: one row of partials per group."""
        calls, names = [], []
        picked: list[tuple[Aggregate, str]] = []
        for a in self.aggregates:
            for name, _ in a.partial_names():
                part = name.rsplit(".", 1)[1]
                if a.kind in PICKING and part != "nn":
                    picked.append((a, name))  # computed from the group ids below
                    continue
                if a.kind == "max_by":  # nn: rows with both columns non-null
                    valid = pc.and_(  # pyright: ignore[reportAttributeAccessIssue]
                        pc.is_valid(table[a.column]),  # pyright: ignore[reportAttributeAccessIssue]
                        pc.is_valid(table[a.by]))  # pyright: ignore[reportAttributeAccessIssue]
                    table = table.append_column(f"__valid.{a.output}", pc.cast(valid, pa.int64()))
                    calls.append((f"__valid.{a.output}", "sum"))
                elif part == "n":
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
        if not picked:
            grouped = table.group_by(by, use_threads=False).aggregate(calls)
            return _rename_partials(grouped, by, names, self)
        grouped, gid = _group_with_ids(table, by, calls)
        partials = _rename_partials(grouped, by, names, self)
        return self._add_picked(partials, by, gid, lambda a: _row_candidates(table, a))

    def merge_partials(self, table: pa.Table, by: list[str]) -> pa.Table:
        """Merge partial rows with equal ``by`` columns (from several batches or subtasks)."""
        merges = self.merges
        names = [n for a in self.aggregates for n, _ in a.partial_names()
                 if a.kind not in PICKING or n.endswith(".nn")]
        calls = [(name, merges[name]) for name in names]
        if not self.picking:
            grouped = table.group_by(by, use_threads=False).aggregate(calls)
            return _rename_partials(grouped, by, names, self)
        grouped, gid = _group_with_ids(table, by, calls)
        partials = _rename_partials(grouped, by, names, self)
        return self._add_picked(partials, by, gid, lambda a: _partial_candidates(table, a))

    def _add_picked(self, partials: pa.Table, by: list[str], gid: np.ndarray,
                    candidates) -> pa.Table:
        """``partials`` with the columns of the picking aggregates, from the candidate
        values of each input row (``candidates(aggregate)``) and its group id ``gid``."""
        groups = partials.num_rows
        columns = {n: partials[n] for n in by}
        picked = {}
        for a in self.picking:
            names = [n for n, _ in a.partial_names()]
            if a.kind == "max_by":
                rows, by_values, values = candidates(a)
                best_by, best = _max_by(gid[rows], by_values, values, groups)
                picked[names[0]], picked[names[1]] = pa.array(best_by), pa.array(best)
            else:
                rows, values = candidates(a)
                slots = _top_k(gid[rows], values, groups, a.k)
                for i, name in enumerate(names[:-1]):
                    picked[name] = pa.array(slots[:, i])
        for name in self.partial_columns:
            columns[name] = picked[name] if name in picked else partials[name]
        return pa.table(columns)

    # -- dense accumulators: numpy arrays indexed by key id -------------------------
    def identity(self, name: str, dtype: np.dtype) -> object:
        return _identity(self.merges[name], dtype)

    def merge_all(self, target: dict[str, np.ndarray], index: np.ndarray,
                  values: dict[str, np.ndarray]) -> None:
        """Every partial column: ``target[n][index] = merge(target[n][index], values[n])``;
        ``index`` has no duplicates."""
        done = set()
        for a in self.picking:
            names = [n for n, _ in a.partial_names()]
            if a.kind == "max_by":
                nb, nv, nn = names
                tb, tv, tn = target[nb][index], target[nv][index], target[nn][index]
                vb, vv, vn = values[nb], values[nv], values[nn]
                wins = (vn > 0) & ((tn == 0) | (vb > tb) | ((vb == tb) & (vv < tv)))
                target[nb][index] = np.where(wins, vb, tb)
                target[nv][index] = np.where(wins, vv, tv)
            else:
                slots = names[:-1]
                both = np.concatenate([np.stack([target[n][index] for n in slots], axis=1),
                                       np.stack([values[n] for n in slots], axis=1)], axis=1)
                both = -np.sort(-both, axis=1) if both.dtype.kind == "f" else np.sort(both, axis=1)[:, ::-1]
                for i, n in enumerate(slots):
                    target[n][index] = both[:, i]
            done.update(names[:-1])
        for name in self.partial_columns:
            if name not in done:
                self.merge_into(name, target[name], index, values[name])

    def merge_dicts(self, a: dict, b: dict) -> dict:
        """Merge two accumulators of the generic path (dicts of partial scalars)."""
        if not self.picking:  # sums, minima and maxima of scalars: no arrays needed
            merges = self.merges
            return {n: _merge_scalars(merges[n], v, b[n]) for n, v in a.items()}
        index = np.zeros(1, dtype=np.int64)
        target = {n: np.array([v]) for n, v in a.items()}
        self.merge_all(target, index, {n: np.array([v]) for n, v in b.items()})
        return {n: column[0].item() for n, column in target.items()}

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
            elif a.kind == "max_by":
                values, seen = partials[names[1]], partials[names[2]]
                out[a.output] = pa.array(values, mask=seen == 0)
            elif a.kind == "top_k":
                slots = np.stack([partials[n] for n in names[:-1]], axis=1)
                lengths = np.minimum(partials[names[-1]], a.k).astype(np.int32)
                keep = np.arange(a.k)[None, :] < lengths[:, None]
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
                out[a.output] = pa.ListArray.from_arrays(pa.array(offsets),
                                                         pa.array(slots[keep]))
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


def _group_with_ids(table: pa.Table, by: list[str], calls: list) -> tuple[pa.Table, np.ndarray]:
    """``group_by(by).aggregate(calls)`` and the output group of every input row (from a
    ``list`` of row numbers in the same ``group_by``, so groups line up exactly)."""
    table = table.append_column("__row", pa.array(np.arange(table.num_rows, dtype=np.int64)))
    grouped = table.group_by(by, use_threads=False).aggregate([*calls, ("__row", "list")])
    lists = grouped["__row_list"].combine_chunks()
    gid = np.empty(table.num_rows, dtype=np.int64)
    gid[_numpy(pc.list_flatten(lists))] = _numpy(  # pyright: ignore[reportAttributeAccessIssue]
        pc.list_parent_indices(lists))  # pyright: ignore[reportAttributeAccessIssue]
    return grouped.drop_columns(["__row_list"]), gid


def _numeric(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
            or pa.types.is_decimal(kind))


def _numpy(column) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.to_numpy(zero_copy_only=False)


def _row_candidates(table: pa.Table, a: Aggregate):
    """Raw rows: (row numbers, values[, by values]) of the rows ``a`` considers."""
    valid = pc.is_valid(table[a.column])  # pyright: ignore[reportAttributeAccessIssue]
    if a.kind == "max_by":
        valid = pc.and_(valid, pc.is_valid(table[a.by]))  # pyright: ignore[reportAttributeAccessIssue]
    rows = np.flatnonzero(_numpy(valid))
    index = pa.array(rows)
    values = _numpy(table[a.column].take(index))
    if a.kind == "max_by":
        return rows, _numpy(table[a.by].take(index)), values
    return rows, values


def _partial_candidates(table: pa.Table, a: Aggregate):
    """Partial rows: the same candidates, from their picked partial columns."""
    names = [n for n, _ in a.partial_names()]
    seen = _numpy(table[names[-1]])
    if a.kind == "max_by":
        rows = np.flatnonzero(seen > 0)
        return rows, _numpy(table[names[0]])[rows], _numpy(table[names[1]])[rows]
    slots = np.stack([_numpy(table[n]) for n in names[:-1]], axis=1)
    keep = np.arange(a.k)[None, :] < np.minimum(seen, a.k)[:, None]
    rows = np.broadcast_to(np.arange(table.num_rows)[:, None], keep.shape)
    return rows[keep], slots[keep]


def _max_by(gid: np.ndarray, by_values: np.ndarray, values: np.ndarray,
            groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group: the largest ``by`` value and the smallest value among its rows with it."""
    best_by = np.full(groups, _identity("max", by_values.dtype), dtype=by_values.dtype)
    np.maximum.at(best_by, gid, by_values)
    tied = by_values == best_by[gid]
    best = np.full(groups, _identity("min", values.dtype), dtype=values.dtype)
    np.minimum.at(best, gid[tied], values[tied])
    return best_by, best


def _top_k(gid: np.ndarray, values: np.ndarray, groups: int, k: int) -> np.ndarray:
    """Per group: its ``k`` largest values, largest first, padded with the identity."""
    slots = np.full((groups, k), _identity("top", values.dtype), dtype=values.dtype)
    if not len(values):
        return slots
    order = np.lexsort((values, gid))  # by group, ascending values
    gid, values = gid[order], values[order]
    ends = np.cumsum(np.bincount(gid, minlength=groups))
    from_end = ends[gid] - 1 - np.arange(len(gid))  # 0: the group's largest value
    keep = from_end < k
    slots[gid[keep], from_end[keep]] = values[keep]
    return slots


def _identity(merge: str, dtype) -> object:
    """The value that leaves any other unchanged under ``merge``."""
    if merge == "sum":
        return 0
    if merge == "val":  # max_by's value: unused while its count is 0
        return 0
    if merge == "top":  # an empty top-k slot: below every value
        merge = "max"
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    if merge == "min":
        return info.max if info else np.inf
    return info.min if info else -np.inf


def _merge_scalars(merge: str, a, b):
    """``merge`` of two partial scalars, as the array path would (a NaN wins min and max,
    as with ``np.minimum``/``np.maximum``)."""
    if merge == "sum":
        return a + b
    if a != a or b != b:
        return float("nan")
    return min(a, b) if merge == "min" else max(a, b)
