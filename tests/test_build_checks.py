"""Column names are checked when the job is built: a typo fails at the call that made it,
naming the call, the stream, its columns and a close match, before anything runs.

The columns a stream claims to know are checked against a run's real output (the
oracle): a wrong claim would refuse jobs that work, or let typos through.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest

import raystream as rs

TUMBLING = rs.TumblingEventTimeWindows(size_ms=1000)


def clicks(env: rs.StreamEnvironment) -> rs.DataStream:
    return env.from_collection([{"user": "a", "ts": 5, "x": 1.0}, {"user": "b", "ts": 7}],
                               name="clicks")


def test_a_misspelt_key_names_the_call_the_columns_and_a_close_match():
    env = rs.StreamEnvironment(parallelism=2)
    with pytest.raises(rs.SchemaError) as caught:
        clicks(env).key_by("usr")
    assert str(caught.value) == ("key_by('usr'): the stream from 'clicks' has no column 'usr' "
                                 "(its columns: user, ts, x); did you mean 'user'?")
    assert (caught.value.column, caught.value.columns) == ("usr", ("user", "ts", "x"))
    assert isinstance(caught.value, ValueError)  # where a user's code catches bad arguments


@pytest.mark.parametrize("build, message", [
    (lambda s: s.key_by(["user", "day"]),
     "key_by(['user', 'day']): the stream from 'clicks' has no column 'day' (its columns: "
     "user, ts, x)"),
    (lambda s: s.key_by("user").window(TUMBLING, timestamp="time").count(),
     "window(timestamp='time'): the stream from 'clicks' has no column 'time' (its columns: "
     "user, ts, x)"),
    (lambda s: s.key_by("user").window(TUMBLING, timestamp="ts").agg(total=("sum", "xs")),
     "agg(total=('sum', 'xs')): the stream from 'clicks' has no column 'xs' (its columns: "
     "user, ts, x); did you mean 'x'?"),
    (lambda s: s.key_by("user").window(TUMBLING, timestamp="ts").max_by("x", "price"),
     "agg(x=('max_by', 'x')): the stream from 'clicks' has no column 'price'"),
    # the columns a window's aggregates emit, and a filter keeps
    (lambda s: s.key_by("user").window(TUMBLING, timestamp="ts").sum("x").key_by("ts"),
     "key_by('ts'): the stream from 'window' has no column 'ts' (its columns: user, "
     "window_start, window_end, x)"),
    (lambda s: s.filter(lambda row: True).key_by("usr"),
     "key_by('usr'): the stream from 'filter' has no column 'usr'"),
], ids=["key columns", "window time", "aggregate column", "max_by's by", "after a window",
        "after a filter"])
def test_every_name_a_job_uses_is_checked(build, message):
    with pytest.raises(rs.SchemaError, match="^" + re.escape(message)):
        build(clicks(rs.StreamEnvironment(parallelism=2)))


def test_watermarks_name_a_column_of_their_source():
    env = rs.StreamEnvironment(parallelism=1)
    with pytest.raises(rs.SchemaError, match=r"^watermarks=BoundedOutOfOrderness\('ts'\): "
                                             r"the stream from 'sequence' has no column 'ts' "
                                             r"\(its columns: k, t\); did you mean 't'\?"):
        env.from_sequence(10, lambda i: {"k": i, "t": i},
                          watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=5))


def test_unknown_columns_are_left_to_the_first_batch():
    env = rs.StreamEnvironment(parallelism=1)
    # a user function's output, a side output, no rows, a columns function that fails on
    # an empty index: nothing known, nothing refused
    clicks(env).map_batches(lambda b: b).key_by("anything")
    clicks(env).key_by("user").window(TUMBLING, timestamp="ts", late_output="late").count(
    ).side_output("late").key_by("anything")
    env.from_collection([]).key_by("anything")
    env.from_sequence(10, lambda i: {"k": i[0] + i}).key_by("anything")


def test_declared_schemas_count_as_known():
    env = rs.StreamEnvironment(parallelism=1)
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    with pytest.raises(rs.SchemaError, match=r"^key_by\('x'\): the stream from 'map'"):
        clicks(env).map(lambda row: {"user": row["user"], "n": 1}, schema=schema).key_by("x")


def test_the_columns_a_stream_knows_are_those_it_emits(ray_session):
    """Every stream's known columns, against the column names of what it emitted."""
    env = rs.StreamEnvironment(parallelism=2)
    events = env.from_arrow(pa.table({"user": np.arange(40) % 3, "ts": np.arange(40) * 100,
                                      "x": np.ones(40)}), name="events")
    windows = events.key_by("user").window(TUMBLING, timestamp="ts")
    streams = {
        "events": events,
        "filtered": events.filter_batches(lambda b: pa.compute.greater(b["ts"], 500)),
        "sequence": env.from_sequence(30, lambda i: {"k": i % 4, "v": i * 2}),
        "collection": env.from_collection([{"a": 1}, {"a": 2, "b": "x"}]),
        "counts": windows.count(),
        "aggregates": windows.agg(n=("count", None), total=("sum", "x"), top=("max", "ts")),
        "chained": windows.sum("x").key_by("user").window(
            rs.TumblingEventTimeWindows(size_ms=4000)).count(),
        "all": events.window_all(TUMBLING, timestamp="ts").count(),
        "count_window": events.key_by("user").count_window(5).agg(n=("count", None),
                                                                  top=("max", "x")),
        "union": events.union(events.filter(lambda r: r["user"] == 1)),
    }
    sinks = {name: s.collect(name=f"out-{name}") for name, s in streams.items()}
    result = env.execute("known-columns")
    for name, stream in streams.items():
        emitted = result.table(sinks[name]).column_names
        assert stream.columns is not None, name
        assert sorted(stream.columns) == sorted(emitted), name
