"""Arrow schemas as Spark sees them: one mapping for committed files and hand-offs alike.

Timestamps become Spark ``TimestampType`` (instants, shown in the session
time zone), with or without an Arrow time zone; Spark keeps microseconds.
Types Spark has no equivalent for (unsigned 64-bit integers, ...) are refused
with the column's name.

    >>> import pyarrow as pa
    >>> spark_schema(pa.schema([("k", pa.int64()), ("ts", pa.timestamp("ns"))])).simpleString()
    'struct<k:bigint,ts:timestamp>'
    >>> spark_schema(pa.schema([("u", pa.uint64())]))
    Traceback (most recent call last):
    ...
    TypeError: column 'u' has type uint64, which Spark cannot represent; cast it first (e.g. to int64 or decimal(20, 0))
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from raystream.spark.extra import require_spark


def spark_schema(schema: pa.Schema) -> Any:
    """The ``pyspark.sql.types.StructType`` of ``schema``."""
    require_spark("a Spark schema", modules=("pyspark",))
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    fields = []
    for field in schema:
        try:
            fields.append(StructField(field.name, from_arrow_type(field.type), field.nullable))
        except Exception:
            raise TypeError(
                f"column '{field.name}' has type {field.type}, which Spark cannot represent; "
                f"cast it first (e.g. to int64 or decimal(20, 0))") from None
    return StructType(fields)


def transfer_schema(spark_struct: Any) -> pa.Schema:
    """The Arrow schema Spark's Arrow readers expect for ``spark_struct``
    (timestamps in microseconds with time zone UTC, plain strings)."""
    require_spark("a Spark schema", modules=("pyspark",))
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_struct)
