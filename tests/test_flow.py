"""Flow of data and time through the runtime: backpressure, key placement, watermarks."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import pyarrow as pa
import pytest
import ray

import raystream as rs
from tests.support.functions import WatermarkProbe
from tests.support.jobs import object_store_bytes


ROWS_PER_BATCH, NUM_BATCHES = 16_384, 150
BATCH_BYTES = ROWS_PER_BATCH * 8 * 8  # 8 int64 columns: 1 MiB


def run_into_a_slow_sink(env: rs.StreamEnvironment, name: str):
    """Run NUM_BATCHES batches of 1 MiB into a sink that sleeps 20 ms a batch, sampling
    the object store's bytes above the start every 20 ms: the result, the sink and
    ``[(seconds since the submission, bytes)]``."""
    source = env.from_sequence(
        ROWS_PER_BATCH * NUM_BATCHES,
        lambda i: {f"c{j}": i + j for j in range(8)}, batch_size=ROWS_PER_BATCH, num_splits=1)

    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.02)
        return batch

    sink = source.rebalance().map_batches(slow, name="slow").discard()
    baseline = object_store_bytes()
    samples: list[tuple[float, int]] = []
    client = env.execute_async(name)
    started, done = time.monotonic(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.monotonic() - started, object_store_bytes() - baseline))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = client.wait(timeout_s=120)
    finally:
        done.set()
        sampler.join()
    assert result.count(sink) == ROWS_PER_BATCH * NUM_BATCHES
    return result, sink, samples


@pytest.mark.slow
def test_slow_sink_bounds_object_store_memory(ray_session):
    """With a sink that sleeps, in-flight data stays bounded by credits, not by the source."""
    credits = 2
    env = rs.StreamEnvironment(parallelism=1, credits=credits)
    result, _, samples = run_into_a_slow_sink(env, "backpressure")
    # The sink really was the bottleneck for the whole run.
    assert result.run_s >= NUM_BATCHES * 0.02
    # In flight at most: `credits` batches on the channel, one being processed
    # and one waiting in the source's backlog -- plus slack for Ray's 50 ms
    # free period (EMBEDDED_RAY_SYSTEM_CONFIG) at the sink's 50 batches/s.
    bound = (credits + 2) * BATCH_BYTES + 3 * BATCH_BYTES
    total = NUM_BATCHES * BATCH_BYTES
    assert len(samples) > 20
    assert max(b for _, b in samples) <= bound, (max(b for _, b in samples), bound)
    assert total > 10 * bound  # without backpressure the store would have held far more


@pytest.mark.slow
def test_data_in_flight_to_a_slow_subtask_is_bounded_in_time_not_by_credits(ray_session):
    """``in_flight_ms``: a sink that takes 20 ms a batch of 1 MiB consumes ~50 MB/s, so
    50 ms of it is ~3 batches; the source starts with 1 credit of its 16 and, once the
    sink has measured its rate, may hold only those 3: from the job's first batch on,
    the object store holds about 3 batches instead of 16 (a source given all 16 at the
    start filled the channel before the sink had measured anything). Every row still
    arrives."""
    env = rs.StreamEnvironment(parallelism=1, credits=16, in_flight_ms=50)
    _, _, samples = run_into_a_slow_sink(env, "bounded-in-time")
    # In flight at most: the credits the sink lets the source hold (<= 3: it can never
    # consume faster than 1 MiB per 20 ms), one batch being processed and one in the
    # source's backlog, plus the slack of test_slow_sink_bounds_object_store_memory;
    # with all 16 credits held it would be 18 batches and more.
    running = [b for t, b in samples if b > 0]  # from the first batch out on
    assert len(running) > 20
    assert max(running) <= (3 + 2 + 3) * BATCH_BYTES, (max(running) / BATCH_BYTES, "batches")


class _Placement:
    def open(self, ctx: rs.RuntimeContext) -> None:
        self.subtask = ctx.subtask_index

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        return batch.append_column("subtask", pa.array([self.subtask] * batch.num_rows, pa.int64()))


@pytest.mark.slow
@pytest.mark.parametrize("key_kind", ["int", "str", "composite"])
def test_key_by_sends_each_key_to_the_subtask_owning_its_key_group(ray_session, key_kind):
    parallelism, n = 3, 20_000
    env = rs.StreamEnvironment(parallelism=parallelism)
    source = env.from_sequence(
        n, lambda i: {"id": i, "num": (i * 31) % 1009 - 500,
                      "name": np.char.add("user-", ((i * 17) % 613).astype(str))},
        batch_size=999, num_splits=4, parallelism=2)
    key = {"int": "num", "str": "name", "composite": ["num", "name"]}[key_kind]
    sink = source.key_by(key).map_batches(_Placement(), name="placed").collect()
    out = env.execute(f"placement-{key_kind}").table(sink)
    assert sorted(out.column("id").to_pylist()) == list(range(n))  # nothing lost or doubled
    columns = [key] if isinstance(key, str) else key
    keys = list(zip(*(out.column(c).to_pylist() for c in columns)))
    subtasks_of: dict[tuple, set[int]] = collections.defaultdict(set)
    for k, s in zip(keys, out.column("subtask").to_pylist()):
        subtasks_of[k].add(s)
    assert all(len(s) == 1 for s in subtasks_of.values())
    for k, (s,) in subtasks_of.items():
        group = rs.key_group_of(k if len(k) > 1 else k[0], 128)  # per-row path as the oracle
        assert s == rs.subtask_for_key_group(group, parallelism, 128)
    assert len({s for (s,) in subtasks_of.values()}) == parallelism  # the keys spread


@pytest.mark.slow
def test_watermarks_cross_a_shuffle_as_min_over_channels(ray_session):
    n, splits, bound = 40_000, 4, 50
    base = 1_700_000_000_000

    def columns(i: np.ndarray) -> dict:
        # In order within each split; splits interleave in event time.
        return {"k": i % 101, "ts": base + (i % (n // splits)) * 10 + i // (n // splits)}

    env = rs.StreamEnvironment(parallelism=3)
    source = env.from_sequence(n, columns, batch_size=500, num_splits=splits, parallelism=2,
                               watermarks=rs.BoundedOutOfOrderness("ts", bound_ms=bound))
    probe = source.key_by("k").transform("probe", lambda name: WatermarkProbe(name))
    sink = probe.collect()
    out = env.execute("watermarks").table(sink).to_pylist()

    ts = columns(np.arange(n))["ts"]
    # Oracle: a source subtask's watermark is the min over its splits of
    # (max ts seen - bound - 1), so no watermark can pass the largest possible one.
    highest_possible = int(ts.max()) - bound - 1
    by_subtask = collections.defaultdict(list)
    for row in out:
        by_subtask[row["subtask"]].append(row)
    assert sorted(by_subtask) == [0, 1, 2]
    for rows in by_subtask.values():
        marks = [r["watermark"] for r in rows]
        assert marks == sorted(set(marks))           # strictly increasing
        assert marks[-1] == rs.MAX_WATERMARK           # end of input flushes event time
        progress = [m for m in marks if m != rs.MAX_WATERMARK]
        assert len(progress) >= 5                     # event time really advanced in-band
        assert max(progress) <= highest_possible
        assert rows[-1]["late"] == 0                  # in-order splits: nothing behind a watermark
    assert sum(rows[-1]["rows"] for rows in by_subtask.values()) == n


def test_cancel_stops_a_running_job_and_its_subtasks(ray_session):
    env = rs.StreamEnvironment(parallelism=2)

    def slow(batch: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(0.05)
        return batch

    env.from_sequence(10_000_000, batch_size=1000).map_batches(slow, name="slow").discard()
    client = env.execute_async("cancel-me")
    deadline = time.monotonic() + 60
    while client.status() != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    actor = client.subtask_actor("slow", 0)
    client.cancel()
    result = client.wait(timeout_s=60)
    assert result.status == "CANCELED"
    try:  # the job's subtasks have ended; their actors are gone, or idle in the driver's pool
        assert not ray.get(actor.running.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        pass
