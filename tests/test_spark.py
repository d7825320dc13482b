"""Results reach a real local Spark session through RayDP."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import raystream as rs


def test_job_result_hands_off_to_spark(spark):
    n = 20_000
    env = rs.StreamEnvironment(parallelism=2)
    source = env.from_sequence(n, lambda i: {"k": i % 17, "v": i * 3, "name": np.char.add("n", (i % 5).astype(str))},
                               batch_size=1000)
    sink = source.key_by("k").map_batches(lambda b: b, name="keyed").collect()
    table = env.execute("to-spark").table(sink)

    df = rs.spark.to_spark(spark, table)
    assert df.count() == n
    assert {f.name: f.dataType.simpleString() for f in df.schema.fields} == {
        "k": "bigint", "v": "bigint", "name": "string"}
    sums = {r["k"]: r["s"] for r in df.groupBy("k").agg({"v": "sum"}).withColumnRenamed(
        "sum(v)", "s").collect()}
    i = np.arange(n)
    assert sums == {k: int((i[i % 17 == k] * 3).sum()) for k in range(17)}


def test_handoff_refuses_int64_that_pandas_would_corrupt(spark):
    exact = pa.table({"x": pa.array([2**60 + 1, None], pa.int64())})
    with pytest.raises(ValueError, match="column 'x' is int64 with nulls"):
        rs.spark.to_spark(spark, exact)
    # Without nulls the values survive exactly.
    df = rs.spark.to_spark(spark, pa.table({"x": pa.array([2**60 + 1, -(2**62)], pa.int64())}))
    assert sorted(r["x"] for r in df.collect()) == [-(2**62), 2**60 + 1]
