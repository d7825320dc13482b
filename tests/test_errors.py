"""What a user sees when a job fails: real failures in real Ray jobs.

Every failure here is a real one (a raising user function, a bad record, a
cluster too small); the assertions check that the error names what a user
needs to find the cause: operator, subtask, original exception and traceback,
the record and the column.
"""

from __future__ import annotations

import threading
import time

import pytest
import ray

import raystream as rs

pytestmark = pytest.mark.timeout(120)


def _actor_names(prefix: str) -> list[str]:
    """Names of every actor (alive or dead) this Ray session has seen that start with prefix."""
    from ray._private import state

    return [a.get("Name", "") for a in state.actors().values()
            if a.get("Name", "").startswith(prefix)]


# ---------------------------------------------------------------------------
# A user function raising inside map
# ---------------------------------------------------------------------------

ROWS = [{"user": f"u{i}", "amount": i} for i in range(20)]
BAD_AMOUNT = 13  # rows 10..19 are the second of two contiguous splits -> subtask index 1


def explode_on_thirteen(row):
    if row["amount"] == BAD_AMOUNT:
        raise ValueError(f"cannot parse amount {row['amount']} for {row['user']}")
    return {"user": row["user"], "amount": row["amount"] * 2}


@pytest.fixture(scope="module")
def map_failure(ray_session):
    env = rs.StreamEnvironment(parallelism=2)
    sink = env.from_collection(ROWS, num_splits=2).map(explode_on_thirteen, name="parse").collect()
    started = time.perf_counter()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute("map-raises")
    assert time.perf_counter() - started < 60
    del sink
    return info.value


def test_map_failure_message_names_operator_subtask_cause_and_record(map_failure):
    message = str(map_failure)
    assert "map-raises" in message  # the job
    assert "'parse'" in message  # the operator, by the name given with name=
    assert "subtask 2/2" in message  # the record lives in the second split
    assert "ValueError" in message
    assert f"cannot parse amount {BAD_AMOUNT} for u{BAD_AMOUNT}" in message
    assert repr({"user": f"u{BAD_AMOUNT}", "amount": BAD_AMOUNT}) in message  # the record
    # the original traceback, down to the user's function
    assert "Traceback" in message
    assert "explode_on_thirteen" in message
    assert 'raise ValueError(f"cannot parse amount' in message


def test_map_failure_attributes(map_failure):
    assert map_failure.operator == "parse"
    assert map_failure.traceback is not None
    assert "explode_on_thirteen" in map_failure.traceback
    assert "ValueError" in map_failure.traceback


def test_map_failure_attribute_names_subtask(map_failure):
    """JobFailedError documents ``subtask``: the index of the subtask that failed."""
    assert map_failure.subtask == 1


# ---------------------------------------------------------------------------
# Bad records
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1024, 1], ids=["null-in-batch", "column-missing"])
def test_key_by_on_missing_key_names_column_and_record(ray_session, batch_size):
    rows = [{"user": "a", "amount": 1}, {"user": "b", "amount": 5},
            {"amount": 777},  # no "user": a null key
            {"user": "a", "amount": 3}]
    env = rs.StreamEnvironment(parallelism=1)
    sink = env.from_collection(rows, batch_size=batch_size).key_by("user").reduce(
        lambda acc, row: {"user": row["user"], "amount": acc["amount"] + row["amount"]},
        name="sum").collect()
    with pytest.raises(rs.BadRecordError) as info:  # a user's data error keeps its type
        env.execute("null-key")
    assert isinstance(info.value, rs.JobFailedError)
    message = str(info.value)
    assert "'user'" in message  # the key column
    assert "'amount': 777" in message  # the record without a key
    assert "null" in message or "missing" in message
    del sink


def test_a_key_that_is_not_valid_unicode_names_the_record(ray_session):
    rows = [{"user": "a", "i": i} for i in range(5)]
    env = rs.StreamEnvironment(parallelism=1)
    env.from_collection(rows).key_by(
        lambda r: "\ud800" if r["i"] == 3 else r["user"]).reduce(lambda acc, row: row).collect()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute("surrogate-key")
    assert "'\\ud800', a string that is not valid Unicode" in str(info.value)
    assert "'i': 3" in str(info.value)


class KeepsALock(rs.KeyedProcessFunction):
    def open(self, ctx):
        self.held = ctx.value_state("held")

    def process_element(self, row, ctx):
        self.held.update({"lock": threading.Lock(), "i": row["i"]})
        yield row


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["heap", "disk"])
def test_a_state_value_that_cannot_be_stored_names_the_state_and_key(ray_session, tmp_path,
                                                                       backend):
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=0.1, storage=str(tmp_path), state_backend=backend, tolerable_failures=0))
    rows = env.from_sequence(2_000, lambda i: {"k": i % 3, "i": i}, batch_size=10)
    rows.map_batches(lambda b: (time.sleep(0.01), b)[1]).key_by("k").process(
        KeepsALock(), name="locker").collect()
    with pytest.raises(rs.JobFailedError) as info:  # heap: at the snapshot; disk: the write
        env.execute(f"unstorable-{backend}")
    message = str(info.value)
    assert "state 'held' of key " in message and "cannot pickle '_thread.lock'" in message


@pytest.mark.slow
def test_a_reduce_result_that_cannot_be_stored_on_disk_names_the_state_and_key(ray_session,
                                                                              tmp_path):
    """Keyed reduce on disk writes a batch at once: the failing value still names its key."""
    env = rs.StreamEnvironment(parallelism=1, checkpoints=rs.CheckpointConfig(
        interval_s=60, storage=str(tmp_path), state_backend="disk", tolerable_failures=0))
    rows = env.from_sequence(200, lambda i: {"k": i % 7, "i": i}, batch_size=50)
    rows.key_by("k").reduce(
        lambda acc, row: {**row, "lock": threading.Lock()} if row["i"] == 193 else row,
        name="locker").collect()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute("unstorable-reduce")
    message = str(info.value)
    # row 193 is key 4's last (193 % 7), so its batch ends with that value to write,
    # which it does before emitting the batch's rows
    assert "state 'reduce' of key 4: " in message
    assert "cannot pickle '_thread.lock'" in message


@pytest.mark.parametrize("where", ["source", "map"])
def test_wrong_type_names_column_and_value(ray_session, where):
    good = [{"user": f"u{i}", "amount": i} for i in range(6)]
    env = rs.StreamEnvironment(parallelism=1)
    if where == "source":
        rows = good[:3] + [{"user": "x", "amount": "abc"}] + good[3:]
        stream = env.from_collection(rows)
    else:
        stream = env.from_collection(good).map(
            lambda r: {"user": r["user"], "amount": "abc" if r["amount"] == 4 else r["amount"]},
            name="stringify")
    sink = stream.key_by("user").reduce(
        lambda acc, row: {"user": row["user"], "amount": acc["amount"] + row["amount"]}).collect()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute(f"wrong-type-{where}")
    message = str(info.value)
    assert "'amount'" in message
    assert "'abc'" in message
    if where == "map":
        assert "stringify" in message
    del sink


def test_map_returning_non_dict_is_a_clear_error(ray_session):
    env = rs.StreamEnvironment(parallelism=1)
    sink = env.from_collection(ROWS).map(lambda r: r["amount"], name="to-int").collect()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute("non-dict")
    message = str(info.value)
    assert "'to-int'" in message
    assert "dict" in message
    assert "int" in message
    del sink


WINDOW_ROWS = [{"user": "a", "ts": 1, "amount": 1, "note": "x"},
               {"user": "b", "ts": 2, "amount": 2, "note": "y"}]


def windowed_rows(shape: str, rows: list[dict] = WINDOW_ROWS, *, known: bool = True):
    """``rows`` keyed by user in windows of ``shape`` (their columns not known when the job
    is built unless ``known``) and its environment."""
    env = rs.StreamEnvironment(parallelism=1)
    stream = env.from_collection(rows)
    if not known:
        stream = stream.map_batches(lambda batch: batch, name="as-is")
    keyed = stream.key_by("user")
    if shape == "count-window":
        return env, keyed.count_window(2)
    assigner = (rs.EventTimeSessionWindows(gap_ms=10) if shape == "session"
                else rs.TumblingEventTimeWindows(size_ms=10))
    return env, keyed.window(assigner, timestamp="ts", pre_aggregate=shape == "pre-aggregated")


SHAPES = ["pre-aggregated", "window", "session", "count-window"]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("column, cause", [("note", "numeric column, 'note' is string"),
                                           ("nope", "needs column 'nope'")])
def test_built_in_aggregate_of_a_text_or_missing_column_names_operator_and_column(
        ray_session, shape, column, cause):
    env, windowed = windowed_rows(shape, known=False)  # a missing column: at the first batch
    sink = windowed.sum(column, name="totals").collect()
    with pytest.raises(rs.JobFailedError) as info:
        env.execute(f"aggregate-{column}-{shape}")
    message = str(info.value)
    assert "totals" in message and cause in message
    del sink


@pytest.mark.parametrize("shape", SHAPES)
def test_a_missing_aggregate_column_of_known_columns_fails_when_the_job_is_built(shape):
    _, windowed = windowed_rows(shape)
    with pytest.raises(rs.SchemaError, match=r"^agg\(nope=\('sum', 'nope'\)\): the stream from "
                                             r"'collection' has no column 'nope'"):
        windowed.sum("nope", name="totals")


@pytest.mark.parametrize("build", [
    lambda keyed: keyed.window(rs.TumblingEventTimeWindows(size_ms=10), timestamp="ts").max("user"),
    lambda keyed: keyed.window(rs.TumblingEventTimeWindows(size_ms=10), timestamp="ts").agg(
        window_end=("max", "ts")),
    lambda keyed: keyed.count_window(2).min("user"),
], ids=["key", "window-column", "count-window-key"])
def test_aggregate_output_named_like_a_key_or_window_column_fails_when_built(build):
    env = rs.StreamEnvironment(parallelism=1)
    with pytest.raises(ValueError, match="also the name of a key or window column"):
        build(env.from_collection(WINDOW_ROWS).key_by("user"))


# ---------------------------------------------------------------------------
# Resources checked before deployment
# ---------------------------------------------------------------------------

def test_too_many_cpus_fails_fast_before_any_actor(ray_session):
    total_cpus = ray.cluster_resources().get("CPU", 0)
    assert 1.5 * 3 > total_cpus  # the test Ray has 2 CPUs
    env = rs.StreamEnvironment(parallelism=3)
    sink = env.from_sequence(100).map(lambda r: r, name="heavy").set_resources(num_cpus=1.5) \
        .collect()
    started = time.perf_counter()
    with pytest.raises(rs.InsufficientResourcesError) as info:
        env.execute("too-big-cpu")
    elapsed = time.perf_counter() - started
    assert elapsed < 5, f"took {elapsed:.1f} s"
    message = str(info.value)
    assert "too-big-cpu" in message
    assert "CPU" in message
    assert _actor_names("raystream/too-big-cpu") == []
    del sink


def test_unknown_custom_resource_fails_fast_before_any_actor(ray_session):
    env = rs.StreamEnvironment(parallelism=1)
    sink = env.from_sequence(100).map(lambda r: r, name="accel") \
        .set_resources(resources={"no_such_accelerator": 1}).collect()
    started = time.perf_counter()
    with pytest.raises(rs.InsufficientResourcesError) as info:
        env.execute("needs-accelerator")
    elapsed = time.perf_counter() - started
    assert elapsed < 5, f"took {elapsed:.1f} s"
    message = str(info.value)
    assert "needs-accelerator" in message
    assert "no_such_accelerator" in message
    assert _actor_names("raystream/needs-accelerator") == []
    del sink


def test_actor_listing_sees_jobs(ray_session):
    """Guard for the two tests above: the listing does see the actors a job starts for
    subtasks with resources of their own (theirs would be such; the rest run on the
    driver's pooled actors and warm job master, named for no job)."""
    env = rs.StreamEnvironment(parallelism=1)
    sink = env.from_sequence(10).map(lambda r: r, name="own").set_resources(num_cpus=0.02) \
        .collect()
    assert env.execute("listed").table(sink).num_rows == 10
    assert _actor_names("raystream/listed-")
