"""SQL's CUMULATE window table function, planned onto the cumulating window assigner: the
count and sum per (key, window) of disordered rows, some beyond the watermark bound, equal
pandas' over the same rows (each row in every window of its cumulation that ends after it
and has not been passed by the watermark the row met); on the heap and, through
checkpoints, on disk; and a size that is not a multiple of the step is a planning error.

The job runs at parallelism 1: the window's watermark at a row is then the one its reader
emitted after the batch before (at a higher parallelism, the least of several channels',
which depends on timing)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import raystream as rs

N, BATCH, BOUND_MS, KEYS = 4_000, 100, 200, 5
STEP_MS, SIZE_MS = 1_000, 4_000
QUERY = f"""
    SELECT k, window_start, window_end, COUNT(*) AS n, SUM(v) AS total
    FROM TABLE(CUMULATE(TABLE events, DESCRIPTOR(ts), INTERVAL '{STEP_MS // 1000}' SECOND,
                        INTERVAL '{SIZE_MS // 1000}' SECOND))
    GROUP BY k, window_start, window_end"""


def events() -> pd.DataFrame:
    """Rows 5 ms apart, disordered within the bound; every 97th row 1.5 to 3.5 s late,
    so late for the small windows of its cumulation and, often, on time for the large."""
    i = np.arange(N)
    late = (i % 97 == 41) * (1_500 + (i % 3) * 1_000)
    return pd.DataFrame({"k": i % KEYS, "v": i % 13,
                         "ts": 10_000 + i * 5 - (i * 7919) % BOUND_MS - late})


def expected(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """pandas: each row in the windows [start, start + j * step) that end after it and
    whose last millisecond the watermark it met (after the batch before) had not reached;
    and how many rows are late for some of their windows and on time for others."""
    ts = df["ts"].to_numpy()
    batch_max = pd.Series(ts).groupby(np.arange(N) // BATCH).max().cummax().to_numpy()
    met = np.concatenate([[np.iinfo(np.int64).min], batch_max[:-1] - BOUND_MS])[
        np.arange(N) // BATCH]
    start = ts // SIZE_MS * SIZE_MS
    parts, windows, on_time = [], np.zeros(N, int), np.zeros(N, int)
    for j in range(1, SIZE_MS // STEP_MS + 1):
        end = start + j * STEP_MS
        counted = (end > ts) & (end - 1 > met)
        windows += end > ts
        on_time += counted
        parts.append(df[counted].assign(window_start=start[counted], window_end=end[counted]))
    rows = pd.concat(parts)
    g = rows.groupby(["k", "window_start", "window_end"])
    out = pd.DataFrame({"n": g.size(), "total": g["v"].sum()}).reset_index()
    partly_late = int(((on_time > 0) & (on_time < windows)).sum())
    return out.sort_values(["k", "window_start", "window_end"]).reset_index(drop=True), partly_late


def run(df: pd.DataFrame, checkpoints: rs.CheckpointConfig | None) -> pd.DataFrame:
    env = rs.StreamEnvironment(parallelism=1, checkpoints=checkpoints)
    table = pa.table({"k": pa.array(df["k"], pa.int64()), "v": pa.array(df["v"], pa.int64()),
                      "ts": pa.array(df["ts"], pa.timestamp("ms"))})
    stream = env.from_arrow(table, batch_size=BATCH, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=BOUND_MS))
    env.create_temporary_view("events", stream, schema=table.schema, rowtime="ts")
    sink = env.sql_query(QUERY).to_stream().collect(name="out")
    got = env.execute("sql-cumulate").table(sink).to_pandas()
    for column in ("window_start", "window_end"):
        got[column] = got[column].astype("datetime64[ms]").astype(np.int64)
    return got.sort_values(["k", "window_start", "window_end"]).reset_index(drop=True)


@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_cumulate_counts_and_sums_equal_pandas_with_rows_beyond_the_bound(
        ray_session, tmp_path, backend):
    df = events()
    want, partly_late = expected(df)
    assert partly_late > 10  # rows late for the small windows of their cumulation only
    checkpoints = None if backend == "heap" else rs.CheckpointConfig(
        interval_s=0.2, storage=str(tmp_path / "chk"), state_backend="disk")
    got = run(df, checkpoints)
    pd.testing.assert_frame_equal(got[["k", "window_start", "window_end", "n", "total"]], want,
                                  check_dtype=False)


def test_a_cumulate_size_not_a_multiple_of_its_step_is_a_planning_error(ray_session):
    env = rs.StreamEnvironment(parallelism=1)
    table = pa.table({"k": pa.array([1], pa.int64()), "ts": pa.array([0], pa.timestamp("ms"))})
    env.create_temporary_view("events", env.from_arrow(table, watermarks=rs.BoundedOutOfOrderness(
        "ts", bound_ms=0)), schema=table.schema, rowtime="ts")
    with pytest.raises(rs.SqlError, match=re.escape(
            "a CUMULATE window's size (2500 ms) must be a multiple of its step (1000 ms)")):
        env.sql_query("SELECT k, COUNT(*) FROM TABLE(CUMULATE(TABLE events, DESCRIPTOR(ts), "
                      "INTERVAL '1' SECOND, INTERVAL '2.5' SECOND)) "
                      "GROUP BY k, window_start, window_end")
