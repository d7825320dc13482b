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


LIMIT = 1 << 62  # the event-time limit, either way


@pytest.mark.parametrize("backend", ["heap", "disk"])
@pytest.mark.parametrize("assigner", [rs.TumblingEventTimeWindows(size_ms=1000, offset_ms=7),
                                      rs.SlidingEventTimeWindows(size_ms=2000, slide_ms=1000),
                                      rs.EventTimeSessionWindows(gap_ms=1000)],
                         ids=["tumbling", "sliding", "session"])
def test_times_at_the_limits_land_in_their_windows(ray_session, tmp_path, assigner, backend):
    ts = [-LIMIT, -LIMIT + 1500, 5, LIMIT - 5000, LIMIT - 4500, LIMIT - 10, LIMIT]
    rows = pa.table({"user": [1] * len(ts), "ts": ts})
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=60, storage=str(tmp_path), state_backend=backend))
    source = env.from_arrow(rows, batch_size=2, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0))
    windows = source.key_by("user").window(assigner, timestamp="ts", allowed_lateness_ms=sys.maxsize,
                                           late_output="late")
    counted = windows.agg(n=("count", None))
    sink, late = counted.collect(), counted.side_output("late").collect(name="late")
    result = env.execute("times-at-the-limits")
    out = result.table(sink).to_pandas()
    got = out.groupby([out["window_start"].astype("int64"), out["window_end"].astype("int64")])[
        "n"].max().to_dict()
    assert result.table(late).num_rows == 0
    assert got == expected_windows(pd.Series(ts, dtype="int64"), assigner)


def expected_windows(ts: pd.Series, assigner) -> dict[tuple[int, int], int]:
    """pandas' windows of ``ts``: start and end to the rows in them."""
    if isinstance(assigner, rs.EventTimeSessionWindows):
        ordered = ts.sort_values().reset_index(drop=True)
        session = ordered.diff().fillna(0).ge(assigner.gap_ms).cumsum()
        spans = ordered.groupby(session).agg(["min", "max", "count"])
        return {(int(s), int(e) + assigner.gap_ms): int(n)
                for s, e, n in spans.itertuples(index=False)}
    slide = getattr(assigner, "slide_ms", assigner.size_ms)
    offset = getattr(assigner, "offset_ms", 0)
    last = ts - (ts - offset).mod(slide)
    starts = pd.concat([last - k * slide for k in range(assigner.size_ms // slide)])
    return {(int(s), int(s) + assigner.size_ms): int(n)
            for s, n in starts.value_counts().items()}


@pytest.mark.parametrize("beyond", [LIMIT + 1, (1 << 63) - 1, -LIMIT - 1, -(1 << 63)])
def test_a_time_beyond_the_limits_fails_the_job_naming_the_record(ray_session, beyond):
    rows = pa.table({"user": [1, 2, 3], "ts": [10, beyond, 20]})
    env = rs.StreamEnvironment(parallelism=1)
    source = env.from_arrow(rows, batch_size=3, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=0))
    source.key_by("user").window(rs.TumblingEventTimeWindows(size_ms=1000),
                                 timestamp="ts").count().collect()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute("time-beyond-the-limits")
    assert f"holds {beyond} ms, beyond the event-time limit" in str(info.value)
    assert "'user': 2" in str(info.value)


def test_spans_beyond_the_limits_are_refused_and_a_huge_bound_waits_for_the_end():
    with pytest.raises(ValueError, match="up to 2\\^60"):
        rs.TumblingEventTimeWindows(size_ms=(1 << 60) + 1)
    with pytest.raises(ValueError, match="at most 2\\^60"):
        rs.IntervalBounds(-(1 << 61), 0)
    # a bound beyond every time holds the watermark at its minimum, not below int64
    assert rs.BoundedOutOfOrderness("ts", bound_ms=sys.maxsize).watermark_for(-5) == -(1 << 63)
