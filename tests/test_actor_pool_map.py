"""``map_batches(Model, concurrency=...)`` on a pool of Ray actors
(engine/operators/pool_map.py, model_pool.py, pool_worker.py): the model applied to every
input batch exactly once, in input order, with backpressure, a pool that grows and
shrinks, pool actors and subtasks SIGKILLed mid-run, a snapshot restored at another
parallelism, and clear errors for a model that raises or returns the wrong type.

Oracle: the input itself, through pandas/numpy (``y = 3 * x + 1`` per row), never the
operator's own figures: a pool actor writes its process id into each row it computed,
which is how a test tells which actors did the work.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from ray._private import state
from ray.core.generated import gcs_pb2

import raystream as rs
from raystream.actors.operator import RestoredState, RuntimeContext
from raystream.engine.operators.model_pool import ModelPool, PoolSize
from raystream.engine.operators.pool_map import PoolMapOperator, PoolOptions
from raystream.engine.operators.pool_worker import BatchFormat, ModelSpec
from tests.support.docs import example
from tests.support.jobs import (checkpointed_env, progress, subtask_pid, wait_for_checkpoint,
                                wait_until)
from tests.support.pacing import Brake

pytestmark = pytest.mark.timeout(240)


class Linear:
    """``y = a * x + b`` on a dict of numpy arrays, after ``sleep_s``; ``keep_even``: only
    the rows of even ``i`` (a model may return fewer rows than it was given)."""

    def __init__(self, a: int, *, b: int = 0, sleep_s: float = 0.0, keep_even: bool = False):
        self.a, self.b, self.sleep_s, self.keep_even = a, b, sleep_s, keep_even

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.sleep_s)
        keep = batch["i"] % 2 == 0 if self.keep_even else np.ones(len(batch["i"]), bool)
        return {"i": batch["i"][keep], "y": self.a * batch["x"][keep] + self.b,
                "pid": np.full(int(keep.sum()), os.getpid())}


class ArrowLinear(Linear):
    """The same model on Arrow batches."""

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:  # type: ignore[override]
        out = super().__call__({n: batch[n].to_numpy() for n in ("i", "x")})
        return pa.record_batch(out)


def inputs(n: int, size: int) -> list[pa.RecordBatch]:
    i = np.arange(n)
    return [pa.record_batch({"i": i[a:a + size], "x": i[a:a + size] * 10})
            for a in range(0, n, size)]


def oracle(n: int, *, keep_even: bool = False) -> pd.DataFrame:
    frame = pd.DataFrame({"i": np.arange(n)})
    frame["y"] = 3 * frame["i"] * 10 + 1
    return frame[frame["i"] % 2 == 0].reset_index(drop=True) if keep_even else frame


class Recording:
    """An output keeping batches and watermarks in the order they came."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def emit(self, batch: pa.RecordBatch) -> None:
        self.events.extend(("row", row) for row in batch.to_pylist())

    def emit_watermark(self, watermark: int) -> None:
        self.events.append(("watermark", watermark))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([v for kind, v in self.events if kind == "row"],
                            columns=["i", "y", "pid"])


@dataclass(frozen=True)
class PoolActor:
    state: str
    resources: dict[str, float]
    pid: int


def pool_actors() -> list[PoolActor]:
    """Every pool actor this Ray session has had, from Ray's actor table (with the
    resources each asked for; the state API needs a dashboard, which is not started)."""
    accessor = state.state._connect_and_get_accessor()
    tables = [gcs_pb2.ActorTableData.FromString(raw)
              for raw in accessor.get_actor_table(None, None)]
    return [PoolActor(gcs_pb2.ActorTableData.ActorState.Name(t.state),
                      dict(t.required_resources), t.pid)
            for t in tables if t.class_name == "PoolWorker"]


def operator(model: type = Linear, *, index: int = 0, parallelism: int = 1, restored=None,
             **options) -> tuple[PoolMapOperator, Recording]:
    options = {"concurrency": 1, "num_cpus": 0.1, "constructor_args": (3,),
               "constructor_kwargs": {"b": 1}, "batch_format": "numpy", **options}
    op = PoolMapOperator("score", PoolOptions(model, **options))
    out = Recording()
    op.setup(RuntimeContext("job", "score", index, parallelism, 128, 0), out)
    op.initialize_state(restored)
    op.open()
    return op, out


@pytest.mark.parametrize("model, batch_format, keep_even",
                         [(Linear, "numpy", False), (ArrowLinear, "pyarrow", False),
                          (Linear, "numpy", True)], ids=["numpy", "pyarrow", "fewer-rows"])
def test_output_is_the_model_applied_to_the_input_in_input_order(ray_session, model,
                                                                 batch_format, keep_even):
    op, out = operator(model, concurrency=2, batch_size=7, batch_format=batch_format,
                       constructor_kwargs={"b": 1, "keep_even": keep_even,
                                           "sleep_s": 0.002})
    n = 500
    for k, batch in enumerate(inputs(n, 50)):
        op.process_batch(batch)
        if k % 4 == 3:
            op.process_watermark(k)
    op.finish()
    op.close()
    got = out.frame()
    pd.testing.assert_frame_equal(got[["i", "y"]], oracle(n, keep_even=keep_even),
                                  check_dtype=False)  # every input once, in input order
    # a watermark k comes after every row of batches 0..k and before every later one
    kept = set(oracle(n, keep_even=keep_even)["i"])
    seen: set[int] = set()
    for kind, value in out.events:
        if kind == "row":
            seen.add(int(value["i"]))  # type: ignore[index]
        else:
            assert seen == kept & set(range((int(value) + 1) * 50)), value  # type: ignore[arg-type]


def test_unordered_results_never_cross_a_watermark(ray_session):
    op, out = operator(concurrency=2, ordered=False,
                       constructor_kwargs={"b": 1, "sleep_s": 0.005})
    n, size = 300, 20
    for k, batch in enumerate(inputs(n, size)):
        op.process_batch(batch)
        if k % 3 == 2:
            op.process_watermark(k)
    op.finish()
    op.close()
    got = out.frame().sort_values("i").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["i", "y"]], oracle(n), check_dtype=False)
    seen: set[int] = set()
    for kind, value in out.events:
        if kind == "row":
            seen.add(int(value["i"]))  # type: ignore[index]
        else:
            assert seen == set(range((int(value) + 1) * size)), value  # type: ignore[arg-type]


def test_a_full_queue_blocks_the_subtask(ray_session):
    """Backpressure: a slow model, at most two batches queued. process_batch returns only
    once all but two of the batches given so far have been emitted."""
    op, out = operator(max_in_flight=2, constructor_kwargs={"b": 1, "sleep_s": 0.05})
    size = 10
    for k, batch in enumerate(inputs(200, size)):
        op.process_batch(batch)
        emitted = len(out.frame())
        assert emitted >= (k + 1 - 2) * size, (k, emitted)
        assert len(op.queue) <= 2
    op.finish()
    op.close()
    pd.testing.assert_frame_equal(out.frame()[["i", "y"]], oracle(200), check_dtype=False)


def test_the_pool_grows_to_its_maximum_under_a_slow_model_and_shrinks_back(ray_session):
    op, out = operator(concurrency=(1, 3), idle_timeout_s=0.3,
                       constructor_kwargs={"b": 1, "sleep_s": 0.05})
    parts = inputs(4_000, 10)
    fed = 0
    while op.metrics()["pool_ready"] < 3 and fed < len(parts) - 20:  # till it has grown
        op.process_batch(parts[fed])
        fed += 1
    assert op.metrics()["pool_ready"] == 3, op.metrics()
    for batch in parts[fed:fed + 20]:  # some batches for every actor
        op.process_batch(batch)
    fed += 20
    op.finish()
    got = out.frame()
    pd.testing.assert_frame_equal(got[["i", "y"]], oracle(fed * 10), check_dtype=False)
    assert got["pid"].nunique() == 3  # three actors computed batches
    deadline = time.monotonic() + 60
    while op.metrics()["pool_size"] > 1 and time.monotonic() < deadline:  # idle: shrinks
        op.on_processing_time(0)
        time.sleep(0.05)
    assert op.metrics()["pool_size"] == 1
    assert op.metrics()["pool_size_peak"] == 3
    op.close()


def test_num_gpus_and_resources_go_into_the_pool_actors_request(ray_session):
    """No GPU here: the actor is pending, and its resource request says what it asked."""
    pool = ModelPool("map_batches 'gpu'", ModelSpec(Linear, (3,), {}, BatchFormat.NUMPY),
                     PoolSize(1, 1), actor_options=PoolOptions(
                         Linear, num_cpus=0.5, num_gpus=1, resources={"accelerator": 2}
                     ).actor_options())
    pool.start()
    try:
        deadline = time.monotonic() + 60
        pending = []
        while not pending and time.monotonic() < deadline:
            pending = [a for a in pool_actors() if a.state == "PENDING_CREATION"]
            time.sleep(0.1)
        assert len(pending) == 1
        assert pending[0].resources == {"CPU": 0.5, "GPU": 1.0, "accelerator": 2.0}
    finally:
        pool.stop()


def test_a_snapshot_midway_restores_at_parallelism_three(ray_session):
    """Batches were in flight at the snapshot: those emitted before it, and what three
    restored subtasks emit, are every input exactly once."""
    op, out = operator(concurrency=2, ordered=False,
                       constructor_kwargs={"b": 1, "sleep_s": 0.03})
    n = 400
    parts = inputs(n, 20)
    for batch in parts[:8]:
        op.process_batch(batch)
    op.prepare_snapshot_pre_barrier(1)
    state = op.snapshot_state(1).operator_state
    assert state is not None
    snapshot = state()
    before = out.frame()
    assert len(before) < 160  # batches were in flight
    op.close()
    got = [before]
    for index in range(3):  # every new subtask is given every old subtask's state
        again, out_again = operator(index=index, parallelism=3,
                                    restored=RestoredState(1, [snapshot]))
        for batch in parts[8:][index::3]:
            again.process_batch(batch)
        again.finish()
        again.close()
        got.append(out_again.frame())
    rows = pd.concat(got).sort_values("i").reset_index(drop=True)
    pd.testing.assert_frame_equal(rows[["i", "y"]], oracle(n), check_dtype=False)


class RaisesOnThirteen(Linear):
    def __call__(self, batch):
        if 13 in batch["i"]:
            raise ValueError("cannot score 13")
        return super().__call__(batch)


class ReturnsAList:
    def __call__(self, batch):
        return list(batch["i"])


class NoCall:
    def predict(self, batch):
        return batch


class CannotLoad:
    def __init__(self):
        raise FileNotFoundError("no weights at /models/missing.pt")

    def __call__(self, batch):
        return batch


def test_a_model_that_raises_fails_the_job_naming_the_operator_and_the_batch(ray_session):
    env = rs.StreamEnvironment(parallelism=1)
    env.from_sequence(40, lambda i: {"i": i, "x": i * 10}, batch_size=10).map_batches(
        RaisesOnThirteen, constructor_args=(3,), concurrency=1, num_cpus=0.1,
        batch_format="numpy", name="score").collect()
    with pytest.raises(rs.JobFailedError) as raised:
        env.execute("pool-raises")
    message = str(raised.value)
    assert "operator 'score'" in message and "ValueError: cannot score 13" in message
    assert "map_batches 'score': in a batch of 10 rows, the first {'i': 10, 'x': 100}" in message


def test_a_model_returning_a_wrong_type_fails_with_a_clear_error(ray_session):
    op, _ = operator(ReturnsAList, constructor_args=(), constructor_kwargs={})
    with pytest.raises(TypeError, match=r"map_batches 'score': the model must return a "
                                        r"pyarrow.RecordBatch, a pyarrow.Table or a dict of "
                                        r"columns, got list") as raised:
        op.process_batch(inputs(5, 5)[0])
        op.finish()
    op.close()
    assert any("the first {'i': 0, 'x': 0}" in note for note in raised.value.__notes__)


def test_a_model_whose_constructor_raises_fails_naming_it(ray_session):
    op, _ = operator(CannotLoad, constructor_args=(), constructor_kwargs={})
    with pytest.raises(FileNotFoundError, match="no weights") as raised:
        op.process_batch(inputs(5, 5)[0])
        op.finish()
    op.close()
    assert any("constructor CannotLoad(...)" in note for note in raised.value.__notes__)


def test_pool_options_are_checked_when_the_job_is_built():
    stream = rs.StreamEnvironment(parallelism=1).from_sequence(10)
    with pytest.raises(TypeError, match="concurrency apply to a model pool: pass a class"):
        stream.map_batches(lambda batch: batch, concurrency=2)
    with pytest.raises(ValueError, match=r"concurrency needs 1 <= min <= max, got \(3, 2\)"):
        stream.map_batches(Linear, concurrency=(3, 2))
    with pytest.raises(ValueError, match="batch_format"):
        stream.map_batches(Linear, batch_format="pandas")
    with pytest.raises(TypeError, match=r"map_batches\('NoCall'\): the model must be a class "
                                        r"with __call__\(batch\)"):
        stream.map_batches(NoCall, concurrency=1)


# -- jobs through kills ---------------------------------------------------------------------

N = 12_000  # 60 batches a split: up to 12 s behind the brake, 1-2 s once released


def pool_job(tmp_path, brake: Brake):
    env = checkpointed_env(str(tmp_path))
    scored = env.from_sequence(N, lambda i: {"i": i, "x": i * 10}, batch_size=100,
                               num_splits=2).map_batches(brake, name="throttle").map_batches(
        Linear, constructor_args=(3,), constructor_kwargs={"b": 1}, concurrency=2,
        num_cpus=0.1, batch_size=25, batch_format="numpy", name="score")
    return env, scored.collect()


def alive_pool_pids() -> set[int]:
    return {a.pid for a in pool_actors() if a.state == "ALIVE" and a.pid}


def test_a_pool_actor_killed_mid_run_is_replaced_and_every_input_is_scored_once(
        ray_session, tmp_path):
    brake = Brake(str(tmp_path), seconds_per_batch=0.2)
    env, sink = pool_job(tmp_path, brake)
    earlier = alive_pool_pids()  # (none, unless a test before this one left some)
    client = env.execute_async("pool-actor-kill")
    wait_for_checkpoint(client, after=1)
    assert wait_until(client, lambda: len(alive_pool_pids() - earlier) >= 4)  # two pools
    before = alive_pool_pids() - earlier
    assert brake.engaged and client.status() == "RUNNING"
    os.kill(min(before), signal.SIGKILL)
    assert wait_until(client, lambda: bool(alive_pool_pids() - before - earlier)), (  # replaced
        before, alive_pool_pids(), client.status())
    brake.release()
    result = client.wait(timeout_s=180)
    assert result.restarts == 0, result.failures  # the pool recovered, not the job
    got = result.table(sink).to_pandas().sort_values("i").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["i", "y"]], oracle(N), check_dtype=False)
    assert set(got["pid"]) - before  # the replacement scored some of the input


def test_a_subtask_killed_with_batches_in_flight_restores_them_exactly_once(
        ray_session, tmp_path):
    brake = Brake(str(tmp_path), seconds_per_batch=0.2)
    env, sink = pool_job(tmp_path, brake)
    earlier = alive_pool_pids()  # (none, unless a test before this one left some)
    client = env.execute_async("pool-subtask-kill")
    completed = wait_for_checkpoint(client, after=1)
    pid = subtask_pid(client, "score", 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until(client, lambda: progress(client)["attempt"] > 0)  # (master may be busy)
    brake.release()
    result = client.wait(timeout_s=180)
    assert result.restarts == 1, result.failures
    assert result.restores[0]["checkpoint_id"] >= completed
    got = result.table(sink).to_pandas().sort_values("i").reset_index(drop=True)
    pd.testing.assert_frame_equal(got[["i", "y"]], oracle(N), check_dtype=False)
    # the killed subtask's pool died with it, the others' were stopped when they closed
    deadline = time.monotonic() + 60
    while alive_pool_pids() - earlier and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive_pool_pids() - earlier


def test_the_guides_example_scores_every_reading_once(ray_session):
    code = example(pathlib.Path(__file__).resolve().parent.parent / "docs" / "guide.md",
                   "## Calling models (actor pools)")
    namespace: dict = {}
    exec(compile(code, "docs/guide.md", "exec"), namespace)
    got = namespace["result"].table(namespace["sink"]).to_pandas().sort_values("id")
    i = np.arange(1_000)
    assert got["id"].tolist() == i.tolist()
    assert (got["alert"].to_numpy() == ((i * 37) % 100 > 90)).all()
