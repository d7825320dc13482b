"""Arrow results into Spark DataFrames through RayDP, without files.

RayDP 1.6.5 moves the data through pandas, where an int64 column with nulls
becomes float64 and loses every value above 2**53. :func:`to_spark` refuses
such a table with a clear error instead of corrupting it silently.

    >>> import pyarrow as pa
    >>> check_exact_transfer(pa.table({"x": pa.array([2**60, None], pa.int64())}))
    Traceback (most recent call last):
    ...
    ValueError: column 'x' is int64 with nulls and values beyond 2**53, which RayDP's pandas path would corrupt; fill the nulls or cast the column to string first
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_EXACT = 2 ** 53


def check_exact_transfer(table: pa.Table) -> None:
    for name, column in zip(table.column_names, table.columns):
        if pa.types.is_integer(column.type) and column.type.bit_width == 64 and column.null_count:
            extremes = pc.min_max(column)
            lo, hi = extremes["min"].as_py(), extremes["max"].as_py()
            if (hi is not None and hi > _EXACT) or (lo is not None and lo < -_EXACT):
                raise ValueError(
                    f"column '{name}' is int64 with nulls and values beyond 2**53, which RayDP's "
                    f"pandas path would corrupt; fill the nulls or cast the column to string first")


def to_spark(spark: Any, table: pa.Table) -> Any:
    """A Spark DataFrame with the rows of ``table``, handed over through Ray's object store."""
    import ray

    check_exact_transfer(table)
    return ray.data.from_arrow(table).to_spark(spark)
