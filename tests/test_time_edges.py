"""Event time at its edges: a lateness that keeps every window, timestamps finer than a
millisecond. The oracle is pandas over the same rows."""

from __future__ import annotations

import sys

import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs


def counts(rows: pa.Table, *, lateness: int, pre_aggregate: bool):
    env = rs.StreamEnvironment(parallelism=1)
    source = env.from_arrow(rows, batch_size=1, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0))
    windows = source.key_by("user").window(
        rs.TumblingEventTimeWindows(size_ms=1000), timestamp="ts", allowed_lateness_ms=lateness,
        pre_aggregate=pre_aggregate, late_output=None if pre_aggregate else "late").agg(
        n=("count", None))
    sink = windows.collect()
    late = None if pre_aggregate else windows.side_output("late").collect(name="late")
    result = env.execute("lateness-keeps-every-window")
    return result.table(sink).to_pandas(), None if late is None else result.table(late)


@pytest.mark.parametrize("pre_aggregate", [True, False])
def test_a_lateness_that_keeps_every_window_counts_every_row(ray_session, pre_aggregate):
    ts = [1000, 2500, 1200, 9000, 1999, 2000]  # 1200 and 1999 arrive after 2500's watermark
    rows = pa.table({"user": [1] * len(ts), "ts": ts})
    out, late = counts(rows, lateness=sys.maxsize, pre_aggregate=pre_aggregate)
    expected = pd.Series(ts).floordiv(1000).mul(1000).value_counts().sort_index()
    final = out.groupby(out["window_start"].astype("int64"))["n"].max().sort_index()
    assert final.to_dict() == expected.to_dict()  # every row counted, windows re-fired
    assert late is None or late.num_rows == 0


def test_timestamps_finer_than_a_millisecond_are_floored_to_it(ray_session):
    ns = [1_000_000_000, 1_999_999_999, 2_000_000_001, 2_500_000_500, -1]
    rows = pa.table({"user": [1] * len(ns), "ts": pa.array(ns, pa.timestamp("ns"))})
    env = rs.StreamEnvironment(parallelism=1)
    source = env.from_arrow(rows, batch_size=2, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=10_000))
    sink = source.key_by("user").window(rs.TumblingEventTimeWindows(size_ms=1000),
                                        timestamp="ts").agg(n=("count", None)).collect()
    out = env.execute("sub-millisecond").table(sink).to_pandas()
    starts = pd.Series(pd.to_datetime(ns, unit="ns")).dt.floor("1s")  # the floor, as pandas
    expected = starts.value_counts().sort_index()
    got = out.set_index(pd.to_datetime(out["window_start"].astype("int64"), unit="ms"))["n"]
    assert got.sort_index().to_dict() == expected.to_dict()
