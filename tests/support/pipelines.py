"""The pipelines of the tests' jobs, built on an environment the test configures: the
exactly-once running sum over ``numbers``, an interval join and the two sides of a
window join over ``join_events``."""

from __future__ import annotations

from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc

import raystream as rs
from tests.support.functions import add
from tests.support.inputs import N, SPLITS, join_events, numbers
from tests.support.pacing import Throttle

Pace = Callable[[pa.RecordBatch], pa.RecordBatch]

throttle = Throttle(0.02)  # keeps a job running (about 2.4 s for N rows) across checkpoints


def build_job(env: rs.StreamEnvironment, parquet_path: str | None = None) -> rs.SinkHandle:
    """The exactly-once job: ``numbers`` (SPLITS splits) -> a throttle -> key_by ->
    a running sum (``sum``) -> a collect sink ``out``; with ``parquet_path`` its sink is
    the exactly-once Parquet sink."""
    source = env.from_sequence(N, numbers, batch_size=100, num_splits=SPLITS, name="numbers")
    running = source.map_batches(throttle, name="throttle").key_by("k").reduce(add, name="sum")
    if parquet_path is not None:
        return running.sink_to_parquet(parquet_path, name="out")
    return running.collect(name="out")


def join_job(env: rs.StreamEnvironment, n: int, lower: int, upper: int, *,
             pace: Pace | None = None, fn: rs.ProcessJoinFunction | None = None
             ) -> rs.SinkHandle:
    """An interval join ``join`` of the left and right rows of ``join_events`` (one
    reader) between ``lower`` and ``upper``, paced by ``pace``, through ``fn``."""
    src = env.from_sequence(n, join_events, batch_size=200, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=100))
    if pace is not None:
        src = src.map_batches(pace, name="throttle")
    left = src.filter_batches(lambda b: pc.equal(b["side"], 0), name="left")
    right = src.filter_batches(lambda b: pc.equal(b["side"], 1), name="right")
    between = left.key_by("k").interval_join(right.key_by("k"), timestamp="ts") \
        .between(lower, upper)
    joined = between.join(name="join") if fn is None else between.process(fn, name="join")
    return joined.collect()


def sides(env: rs.StreamEnvironment, n: int, pace: Pace | None = throttle):
    """The left and right streams of ``join_events`` (disorder 40 ms within a 100 ms
    bound; a minute-late straggler every 400 rows), slowed to span checkpoints."""
    src = env.from_sequence(n, join_events, batch_size=200, num_splits=1,
                            watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=100))
    if pace is not None:
        src = src.map_batches(pace, name="throttle")
    return (src.filter_batches(lambda b: pc.equal(b["side"], 0), name="left"),
            src.filter_batches(lambda b: pc.equal(b["side"], 1), name="right"))
